"""The ES estimator as pure parts: seeded noise, fitness shaping, the float32 master, low-rank members, and the
distributed, checkpoint and consistency rules every trainer and backend shares. Nothing here imports TRL or
transformers."""
