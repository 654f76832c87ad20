"""Several `trl-es vllm-serve` servers driven by one training process: the process's members spread over them.

Each server holds its own master for this run and regenerates a member's noise from its seed, so where a member
generates changes none of its completions: member `i` of the process generates on server `i % len(servers)`, the
servers in parallel, and a run over 2 servers ends with the weights of the run over 1. Updates, centre loads and
consistency checks go to every server; a server that fails raises its own error, which names its address.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager

from ..core.master import MasterWeights
from ..core.noise import Member
from .base import PhaseTimer, RowRequest, rows_by_member
from .sampling import SamplingSettings, row_seeds
from .vllm_server import VLLMServerBackend

# call(server, indices, timer): the results for the items at `indices`, in their order
ShareCall = Callable[[VLLMServerBackend, list[int], PhaseTimer], list]


class VLLMServerPool:
    """A [`PopulationBackend`] over several [`VLLMServerBackend`]s, one per server, that share the trainer's master.

    Args:
        servers (`list[VLLMServerBackend]`): This process's servers, each started for this run (`start_run`).
    """

    def __init__(self, servers: Sequence[VLLMServerBackend]):
        if not servers:
            raise ValueError("VLLMServerPool needs at least one server.")
        self.servers = list(servers)
        self.master: MasterWeights = self.servers[0].master

    def generate(self, members, prompt_ids, sampling, seed, timer=None):
        def share(server, indices, server_timer):
            return server.generate([members[i] for i in indices], prompt_ids, sampling, seed, server_timer)

        return self._spread([index % len(self.servers) for index in range(len(members))], share, timer)

    def generate_center(self, prompt_ids, sampling, seed):
        """The rows spread over the servers, row `j` sampled with `seed + j` as on one server."""
        seeds = row_seeds(seed, len(prompt_ids))

        def share(server, indices, _):
            return server.generate_loaded_rows([prompt_ids[i] for i in indices], [seeds[i] for i in indices], sampling)

        return self._spread([index % len(self.servers) for index in range(len(prompt_ids))], share, None)

    def generate_rows(self, rows: Sequence[RowRequest], sampling: SamplingSettings, timer: PhaseTimer | None = None):
        """Every row of a member on one server: the members, in order of appearance, spread as in `generate`."""
        server_of_row = [0] * len(rows)
        for order, indices in enumerate(rows_by_member(rows).values()):
            for index in indices:
                server_of_row[index] = order % len(self.servers)

        def share(server, indices, server_timer):
            return server.generate_rows([rows[i] for i in indices], sampling, server_timer)

        return self._spread(server_of_row, share, timer)

    @contextmanager
    def member_loaded(self, member: Member | None, timer: PhaseTimer | None = None) -> Iterator[None]:
        """`member` in place on every server, whichever generates its rows (left on every server also on errors)."""
        with ExitStack() as stack:
            for server in self.servers:
                stack.enter_context(server.member_loaded(member, timer))
            yield

    def after_update(self, coefficients: dict[int, float], lr: float, weight_decay: float) -> None:
        self._on_every_server(lambda server: server.after_update(coefficients, lr, weight_decay))

    def check_consistency(self, step: int) -> None:
        expected = self.master.digests()  # once, here: collective where the processes split the master
        self._on_every_server(lambda server: server.check_consistency(step, expected))

    def _spread(self, server_of_item: list[int], share: ShareCall, timer: PhaseTimer | None) -> list:
        """Each server's items (`server_of_item[i]`) through `share`, the servers in parallel; results in item
        order. The step waits for the slowest server, so its phases are the ones added to `timer`."""
        shares = {k: [i for i, server in enumerate(server_of_item) if server == k] for k in set(server_of_item)}
        timers = {k: PhaseTimer() for k in shares}
        results = self._in_parallel([lambda k=k: share(self.servers[k], shares[k], timers[k]) for k in shares])
        ordered: list = [None] * len(server_of_item)
        for indices, result in zip(shares.values(), results, strict=True):
            for index, item in zip(indices, result, strict=True):
                ordered[index] = item
        if timer is not None and timers:
            slowest = max(timers.values(), key=lambda t: sum(t.seconds.values()))
            for phase, seconds in slowest.seconds.items():
                timer.seconds[phase] += seconds
        return ordered

    def _on_every_server(self, call: Callable[[VLLMServerBackend], object]) -> list:
        return self._in_parallel([lambda server=server: call(server) for server in self.servers])

    @staticmethod
    def _in_parallel(jobs: list[Callable[[], object]]) -> list:
        """Run the jobs at once; once all have returned, raise the first failure (no server is left mid-call)."""
        if len(jobs) == 1:
            return [jobs[0]()]
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            futures = [pool.submit(job) for job in jobs]
        return [future.result() for future in futures]
