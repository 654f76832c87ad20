"""`ESConfig` and `ESTrainer`: GRPO's public surface, trained with Evolution Strategies."""
