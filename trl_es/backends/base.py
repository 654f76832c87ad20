"""The interface every way of evaluating a population implements, and the timer its phases report to."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
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


@dataclass(frozen=True)
class RowRequest:
    """One row of [`PopulationBackend.generate_rows`]: a prompt completed with one member's weights, sampled with its
    own seed.

    Args:
        member ([`Member`], *optional*): Whose weights generate the row: `master + sign * sigma * eps(seed)`; None
            for the centre (the master itself).
        prompt_ids (`list[int]`): The token ids to continue (a prompt, or a conversation so far).
        seed (`int`, *optional*): The row's sampling seed; None samples unseeded. Greedy decoding ignores it.
    """

    member: Member | None
    prompt_ids: list[int]
    seed: int | None

    def __post_init__(self):
        if self.member is not None and not isinstance(self.member, Member):
            raise TypeError(f"RowRequest.member must be a Member or None (the centre), got {self.member!r}.")
        if not self.prompt_ids:
            raise ValueError(
                f"RowRequest for member {self.member} has no prompt token: generation needs at least one to continue."
            )


def rows_by_member(rows: Sequence[RowRequest]) -> dict[Member | None, list[int]]:
    """The indices of the rows of each member (None: the centre), members in the order they first appear."""
    groups: dict[Member | None, list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault(row.member, []).append(index)
    return groups


@runtime_checkable
class PopulationBackend(Protocol):
    """Generates completions with the weights of population members, or of the centre (the master).

    Implementations: [`HFBackend`] (weights written into the trainer's model, `model.generate`), [`HFLowRankBackend`]
    (the population in one batched `model.generate`, through forward hooks), [`VLLMColocateBackend`] (weights written
    into an in-process engine), [`VLLMLoRAPopulationBackend`] (low-rank members as LoRA adapters, one `generate`
    call), [`VLLMServerBackend`] (members built inside a `trl-es vllm-serve` server from their seeds).

    Every method leaves the backend generating with the centre: a member's weights never outlive the call that needed
    them, also when it raises (inside `member_loaded`, the member it keeps in place stays).
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

    def generate_rows(
        self, rows: Sequence[RowRequest], sampling: SamplingSettings, timer: PhaseTimer | None = None
    ) -> list[list[int]]:
        """The completion of every [`RowRequest`], in order, each ending at its first EOS token (included): rows of any
        members (and of the centre) in one call, each with its own prompt, e.g. the next turns of multi-turn rollouts.

        The contract, in every backend:

        - every row is generated with its member's weights (`master + sign * sigma * eps`, or the centre's),
          whatever the other rows of the call;
        - a row samples with its own `seed`: its random numbers depend on that seed only, so the same prompt with
          the same seed under the same weights samples alike in every call and for every member (common random
          numbers). Its completion is the same in another call with the same rows; in a call with other rows it is
          the same up to the rounding that batching changes in the logits;
        - greedy decoding (`temperature=0`) ignores seeds;
        - afterwards the backend generates with the centre again, also when it raises (inside `member_loaded`, with
          the member it keeps in place).

        A row's seed is not `generate`'s: `generate` samples row `j` with `seed + j`, here a row samples with `seed`
        as given. Writing weights is timed as `perturb`, generating as `generate`.
        """

    def member_loaded(self, member: Member | None, timer: PhaseTimer | None = None) -> AbstractContextManager[None]:
        """A context in which `member`'s weights stay in place between calls (None: the centre), for a caller that
        generates several times with one member (a rollout function's turns): `generate_rows` loads nothing for its
        rows. It only saves loads, never changes a completion: the rows of other members are still generated with
        their own weights, and leaving the context (also through an exception) puts back what was in place before.
        Backends that write no weights (low-rank hooks, LoRA adapters) have nothing to keep: there it does nothing.
        Inside, generate the centre with `generate_rows` (`member=None`): `generate_center` generates with the
        weights in place."""

    def after_update(self, coefficients: dict[int, float], lr: float, weight_decay: float) -> None:
        """The master has just applied this update: generate with the new centre from now on (a backend that keeps
        its own master, the server's, applies the same update to it)."""

    def check_consistency(self, step: int) -> None:
        """Fail loudly if generation no longer uses the master's weights (`step` names the step in the error)."""


class OneMemberAtATime:
    """`generate` and `generate_rows` for backends that write each member's weights where generation reads them:
    load a member, generate with it, and load back what was in place at the end (also when generation fails). A
    subclass provides `load_member`, `load_center`, `generate_center` (with the weights in place, rows seeded
    `seed + j`) and `generate_loaded_rows` (with the weights in place, each row with its own seed)."""

    # The members that `member_loaded` contexts keep in place, innermost last (None: the centre); outside any, the
    # backend holds the centre.
    _held: tuple[Member | None, ...] = ()

    @property
    def _in_place(self) -> Member | None:
        return self._held[-1] if self._held else None

    def _load(self, member: Member | None) -> None:
        if member is None:
            self.load_center()
        else:
            self.load_member(member)

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
                self._load(self._in_place)
        return completions

    def generate_rows(self, rows, sampling, timer=None):
        """Each member's rows together, each member loaded once: the weights in place first, then the others in
        order of appearance, then what was in place is loaded back."""
        timer = timer or PhaseTimer()
        in_place = self._in_place
        groups = rows_by_member(rows)
        completions: list[list[int]] = [[] for _ in rows]
        loaded = in_place
        try:
            for member in sorted(groups, key=lambda member: member != in_place):  # stable: the others keep their order
                if member != loaded:
                    loaded = _HALF_WRITTEN  # until the load returns: a failed load is undone below
                    with timer("perturb"):
                        self._load(member)
                    loaded = member
                indices = groups[member]
                with timer("generate"):
                    generated = self.generate_loaded_rows(
                        [rows[i].prompt_ids for i in indices], [rows[i].seed for i in indices], sampling
                    )
                for index, completion in zip(indices, generated, strict=True):
                    completions[index] = completion
        finally:
            if loaded != in_place:
                with timer("perturb"):
                    self._load(in_place)
        return completions

    @contextmanager
    def member_loaded(self, member: Member | None, timer: PhaseTimer | None = None) -> Iterator[None]:
        """Load `member` (None: the centre) unless it is in place, keep it there for the context (`generate_rows`
        loads nothing for its rows), and load back what was in place before on leaving, also on errors. Contexts
        nest."""
        timer = timer or PhaseTimer()
        outer, held = self._in_place, self._held
        try:
            if member != outer:
                with timer("perturb"):
                    self._load(member)
            self._held = (*held, member)
            yield
        finally:
            self._held = held
            if member != outer:  # also after a load that failed half-way
                with timer("perturb"):
                    self._load(outer)


# Weights that a load was writing when it failed: neither the member's nor what was in place before.
_HALF_WRITTEN = object()
