"""The benchmark's sections, in the order they run. Each module measures one thing, says how in its docstring, and
has the same three functions (and `worker` where it needs one):

- `model_sizes(cli)`: the `benchmarks.harness.MODEL_SIZES` presets it needs built;
- `run(cli, paths, device)`: measure, print its table, return its outcome (`{"skipped": why}` where it cannot run);
- `result_keys(outcome)`: the top-level RESULT keys it contributes (its whole outcome goes under its name);
- `worker(spec)`, where it measures in fresh processes (`bench.py --worker <spec>`, `spec["section"]` naming it).
"""

from benchmarks.sections import (
    colocate_memory,
    lowrank,
    memory,
    overhead,
    processes,
    scale,
    servers,
    tensor_parallel,
    vllm,
)

# --sections name -> module
SECTIONS = {
    "memory": memory,
    "speed": overhead,
    "lowrank": lowrank,
    "vllm": vllm,
    "processes": processes,
    "scale": scale,
    "colocate_memory": colocate_memory,
    "servers": servers,
    "tensor_parallel": tensor_parallel,
}
# scale, colocate_memory, servers and tensor_parallel take minutes more each (vLLM engines and servers): on request
DEFAULT_SECTIONS = ["memory", "speed", "lowrank", "vllm", "processes"]
