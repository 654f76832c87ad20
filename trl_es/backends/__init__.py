"""How a population is evaluated: each backend writes a member's weights where generation reads them.

A backend has these methods:

- `load_member(member)`: the next generation call uses `master + sign * sigma * eps`;
- `load_center()`: it uses the master itself;
- `after_update(coefficients, lr, weight_decay)`: a backend with its own master (the vLLM server) applies the update;
- `check_consistency(model, step)`: fail loudly if the backend's weights no longer follow the trainer's master.

The vLLM backends also `generate(prompt_ids, seed)`; the Hugging Face one leaves generation to `model.generate`.
"""

from .hf import HFBackend

__all__ = ["HFBackend"]
