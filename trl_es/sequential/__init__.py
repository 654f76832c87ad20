"""`SequentialTrainer`: ES and GRPO stages one after another (ES→GRPO, GRPO→ES), each from the previous one's model."""

from .trainer import SequentialTrainer, Stage

__all__ = ["SequentialTrainer", "Stage"]
