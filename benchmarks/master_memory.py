"""What the ES master holds for a moment beside itself, in bytes per element of the tensor it works on.

The master is computed one tensor at a time, so its largest tensor sets the peak: a 7B model's embedding is 545M
elements, and each float32 temporary of it 2.2 GB. For each master (float32; compensated bfloat16, its value half the
model's bfloat16 weights, as beside a vLLM engine) a fresh process builds it over one tensor of `--rows` x `--cols`
and measures, each from the memory in use just before it, the peak of three operations side by side:

- member: a member's weights written into the bfloat16 parameter, as a backend writes them
  (`perturbed(member, torch.bfloat16)`);
- update: `apply_update` with `--seeds` members' coefficients and weight decay;
- centre: the centre written into the parameter (`centre(torch.bfloat16)`).

The drawn noise is whole (a function of the tensor's full shape), so a member needs its 4 bytes per element and an
update 8 (the direction and one member's noise); the rest is what the arithmetic around it holds:

    .venv/bin/python benchmarks/master_memory.py --rows 8192 --cols 4096

On the CPU the peak is the resident set's (`VmHWM`, with `LIVE_RSS_MALLOC` so that a freed tensor leaves it), on
CUDA (`--device cuda`) `torch.cuda.max_memory_allocated`.
"""

import argparse
import json
import sys
from pathlib import Path

# Run as a script, Python puts benchmarks/ on sys.path; the `benchmarks` package needs the repository root.
REPOSITORY = str(Path(__file__).resolve().parents[1])
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)

from benchmarks.harness import LIVE_RSS_MALLOC, PeakMemory, reply_to_parent, run_worker  # noqa: E402

MASTERS = ("float32", "compensated_bfloat16")
OPERATIONS = ("member", "update", "centre")


def measure(spec: dict) -> dict:
    """In this process: the master of `spec["master"]` over one tensor, and each operation's peak per element."""
    import torch

    from trl_es.core.compensated import CompensatedMasterWeights
    from trl_es.core.master import MasterWeights
    from trl_es.core.noise import Member

    torch.set_num_threads(1)
    device, shape = spec["device"], (spec["rows"], spec["cols"])
    parameter = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device, torch.bfloat16)
    if spec["master"] == "float32":
        master = MasterWeights({"weight": parameter}, sigma=0.01)
    else:
        master = CompensatedMasterWeights({"weight": parameter}, sigma=0.01, share_bfloat16=True)
    coefficients = {seed: 1.0 / (seed + 1) for seed in range(spec["seeds"])}
    operations = {
        "member": lambda: [parameter.copy_(value) for _, value in master.perturbed(Member(7), torch.bfloat16)],
        "update": lambda: master.apply_update(coefficients, lr=1e-3, weight_decay=0.01),
        "centre": lambda: [parameter.copy_(value) for _, value in master.centre(torch.bfloat16)],
    }
    memory, peaks = PeakMemory(device), {}
    for name, operation in operations.items():
        before = memory.current()
        memory.reset_peak()
        operation()
        peaks[name] = (memory.peak() - before) / parameter.numel()
    return {"bytes_per_element": peaks, "master_bytes_per_element": master.nbytes() / parameter.numel()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--seeds", type=int, default=8, help="Members whose noise an update sums.")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        reply_to_parent(measure(json.loads(args.worker)))
        return
    spec = {"rows": args.rows, "cols": args.cols, "seeds": args.seeds, "device": args.device}
    results = {
        master: run_worker(Path(__file__), spec | {"master": master}, f"{master} master run", LIVE_RSS_MALLOC)
        for master in MASTERS
    }
    print(f"one tensor of {args.rows} x {args.cols}, {args.seeds} members per update, on {args.device}; bytes per "
          "element held for a moment beside the master and the bfloat16 parameter")  # fmt: skip
    print(f"{'master':<24}{'holds':>7}" + "".join(f"{name:>9}" for name in OPERATIONS))
    for master, result in results.items():
        peaks = result["bytes_per_element"]
        print(f"{master:<24}{result['master_bytes_per_element']:>7.2f}"
              + "".join(f"{peaks[name]:>9.2f}" for name in OPERATIONS))  # fmt: skip
    keys = {
        f"master_{name}_bytes_per_element_{master}": result["bytes_per_element"][name]
        for master, result in results.items()
        for name in OPERATIONS
    }
    print("RESULT " + json.dumps(keys))


if __name__ == "__main__":
    main()
