"""The benchmark's sections, in the order they run. Each module measures one thing, says how in its docstring, and
has the same three functions:

- `model_sizes(cli)`: the `benchmarks.harness.MODEL_SIZES` presets it needs built;
- `run(cli, paths, device)`: measure, print its table, return its outcome (`{"skipped": why}` where it cannot run);
- `result_keys(outcome)`: the top-level RESULT keys it contributes (its whole outcome goes under its name).
"""

from benchmarks.sections import lowrank, memory, overhead, processes, scale, vllm

# --sections name -> module
SECTIONS = {
    "memory": memory,
    "speed": overhead,
    "lowrank": lowrank,
    "vllm": vllm,
    "processes": processes,
    "scale": scale,
}
DEFAULT_SECTIONS = ["memory", "speed", "lowrank", "vllm", "processes"]
