"""Measuring models the way the paper does: Pass@k / Maj@k, entropy and JS diversity, coverage evaluation during
training (ESTrainer's own and `CoverageEvalCallback`'s), parameter shift, sparsification and forgetting."""
