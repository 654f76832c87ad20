"""The interface every way of evaluating a population implements, and the timer its phases report to."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

from ..core.master import MasterWeights
from ..core.noise import Member
from .sampling import SamplingSettings


class PhaseTimer:
    """Seconds spent in each named phase of a step (`perturb`, `generate`, `reward`, `update`), summed over calls."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start


@runtime_checkable
class PopulationBackend(Protocol):
    """Generates completions with the weights of population members, or of the centre (the master).

    Implementations: [`HFBackend`] (weights written into the trainer's model, `model.generate`), [`HFLowRankBackend`]
    (the population in one batched `model.generate`, through forward hooks), [`VLLMColocateBackend`] (weights written
    into an in-process engine), [`VLLMLoRAPopulationBackend`] (low-rank members as LoRA adapters, one `generate`
    call), [`VLLMServerBackend`] (members built inside a `trl-es vllm-serve` server from their seeds).

    Every method leaves the backend generating with the centre: a member's weights never outlive the call that needed
    them, also when it raises.
    """

    master: MasterWeights  # the float32 centre and sigma; the backend generates with `master + sign * sigma * eps`

    def generate(
        self,
        members: Sequence[Member],
        prompt_ids: list[list[int]],
        sampling: SamplingSettings,
        seed: int | None,
        timer: PhaseTimer | None = None,
    ) -> list[list[list[int]]]:
        """The completion token ids of every member for every row of `prompt_ids`: `result[i][j]` is member `i`'s
        completion of row `j`, ending at its first EOS token (included). Row `j` of every member samples with seed
        `seed + j` (common random numbers); `seed=None` leaves sampling unseeded. Writing weights is timed as
        `perturb`, generating as `generate`."""

    def generate_center(
        self, prompt_ids: list[list[int]], sampling: SamplingSettings, seed: int | None
    ) -> list[list[int]]:
        """The centre's completion of every row (for evaluation); rows sample with `seed + j` as in `generate`."""

    def after_update(self, coefficients: dict[int, float], lr: float, weight_decay: float) -> None:
        """The master has just applied this update: generate with the new centre from now on (a backend that keeps
        its own master, the server's, applies the same update to it)."""

    def check_consistency(self, step: int) -> None:
        """Fail loudly if generation no longer uses the master's weights (`step` names the step in the error)."""


class OneMemberAtATime:
    """`generate` for backends that write each member's weights where generation reads them: load a member, generate
    with it, and load the centre back at the end (also when generation fails). A subclass provides `load_member`,
    `load_center` and `generate_center`."""

    def generate(self, members, prompt_ids, sampling, seed, timer=None):
        timer = timer or PhaseTimer()
        completions = []
        try:
            for member in members:
                with timer("perturb"):
                    self.load_member(member)
                with timer("generate"):
                    completions.append(self.generate_center(prompt_ids, sampling, seed))
        finally:
            with timer("perturb"):
                self.load_center()
        return completions
