"""trl-es: Evolution Strategies post-training for LLMs, as a drop-in for TRL's GRPOTrainer."""

from .es_config import ESConfig
from .es_trainer import ESTrainer

__version__ = "0.1.0"

__all__ = ["ESConfig", "ESTrainer", "__version__"]
