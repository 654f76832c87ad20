"""The DeepSpeed privates that trl-es uses (through `trl_es.compat.deepspeed`), on real processes (gloo over
127.0.0.1). DeepSpeed imported after the process group exists holds the world group in default arguments, and an
engine's clone of it in `deepspeed.utils.groups`: both keep gloo threads running after `destroy_process_group`.
Released, none is left. A DeepSpeed release that changes this fails here, with its version in the message."""

import inspect

import pytest
import torch.distributed as dist
from scripts.threads import gloo_threads

from benchmarks.harness import run_on_processes
from trl_es.compat.deepspeed import release_process_groups


def _torn_down(rank: int, world: int, release: bool, results) -> None:
    import deepspeed
    import deepspeed.comm
    from deepspeed.comm.torch import TorchBackend  # imported after the group exists, as the Trainer imports it
    from deepspeed.utils import groups

    captured = isinstance(inspect.unwrap(TorchBackend.barrier).__defaults__[0], dist.ProcessGroup)
    deepspeed.comm.init_distributed(dist_backend="gloo")  # on the group that exists, as an engine does
    cloned = groups._clone_world_group()  # what an engine caches (collective)
    if release:
        release_process_groups()
    dist.barrier()
    dist.destroy_process_group()  # torch's, as Accelerate's `end_training` calls it
    del cloned
    results[rank] = dict(version=deepspeed.__version__, captured=captured, threads=gloo_threads())


@pytest.mark.parametrize("release", [True, False], ids=["released", "held"])
def test_released_deepspeed_references_let_destroy_process_group_stop_every_gloo_thread(release):
    results = run_on_processes(_torn_down, 2, release)

    for rank in (0, 1):
        version = f"DeepSpeed {results[rank]['version']}"
        assert results[rank]["captured"], f"{version} no longer holds the world group in a default argument"
        if release:
            assert results[rank]["threads"] == [], f"{version}: gloo threads outlived the groups"
        else:  # what the release prevents
            assert results[rank]["threads"], f"{version}: the groups DeepSpeed holds no longer keep their threads"
