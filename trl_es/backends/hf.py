"""The Hugging Face backend: members are evaluated by the trainer's own model with `model.generate`."""

from __future__ import annotations

import torch

from ..master import MasterWeights
from ..noise import Member


class HFBackend:
    """Writes member and centre weights into the trainer's model, whose `generate` then produces the completions.

    Args:
        parameters (`dict[str, torch.nn.Parameter]`):
            The evolving parameters of the model, by name (the same names as in `master`).
        master ([`MasterWeights`]):
            The float32 source of truth.
        sigma (`float`):
            Noise scale of the members.
    """

    def __init__(self, parameters: dict[str, torch.nn.Parameter], master: MasterWeights, sigma: float):
        self.parameters = parameters
        self.master = master
        self.sigma = sigma

    @torch.no_grad()
    def load_member(self, member: Member) -> None:
        for name, value in self.master.perturbed(member, self.sigma):
            self.parameters[name].copy_(value)

    @torch.no_grad()
    def load_center(self) -> None:
        for name, value in self.master.tensors.items():
            self.parameters[name].copy_(value)

    def after_update(self, coefficients: dict[int, float], lr: float, weight_decay: float) -> None:
        """Nothing to do: the trainer's master is the only one."""

    def check_consistency(self, model: torch.nn.Module, step: int) -> None:
        """Nothing to compare: generation reads the trainer's model itself."""
