"""`benchmarks/bench.py`'s command line: its flags, and the presets that set their defaults."""

from __future__ import annotations

import argparse
import sys

import benchmarks
from benchmarks.harness import MODEL_SIZES
from benchmarks.sections import DEFAULT_SECTIONS, SECTIONS
from benchmarks.sections.memory import MEMORY_SETUPS

PRESETS = {
    "default": {},  # the argparse defaults below: the users' regime that fits 2 CPU cores
    "quick": dict(
        memory_model="5M",
        bf16_model="5M",
        batch_size=16,
        max_completion_length=16,
        small_batch="4x4x16",
        curve=["4x64x16"],
        lowrank_populations=[8, 16],
        repetitions=2,
        processes_model="tiny",
        colocate_model="5M",
        servers_model="tiny",
    ),
    "full": dict(
        memory_model="100M",
        batch_size=64,
        max_completion_length=32,
        repetitions=5,
        curve=["4x16x16", "4x64x64", "4x128x64"],
        lowrank_populations=[8, 32, 64],
        sections=[*SECTIONS],
        scale_model="30M",
        servers_model="30M",
        populations=[4, 8, 16, 32],
        batch_sizes=[2, 4, 8, 16],
        model_sizes=["5M", "30M", "100M"],
    ),
    # benchmarks/gpu_check.sh: one GPU, a ~0.5B model in bf16, B and T where users run, under 8 minutes on an H200
    "gpu": dict(
        device="cuda",
        memory_model="0.5B",
        bf16_model="0.5B",
        lowrank_model="0.5B",
        batch_size=128,
        max_completion_length=128,
        small_batch="4x4x32",
        curve=["4x32x64"],
        lowrank_populations=[8, 32],
        lowrank_batch_size=16,
        lowrank_fullrank=False,  # 32 members one after another would take minutes
        repetitions=2,
        sections=["memory", "speed", "lowrank", "vllm", "processes"],
    ),
    # tests/test_gpu_check.py and tests/test_bench.py: every code path, on the tiny model, in seconds
    "tiny": dict(
        memory_model="tiny",
        bf16_model="tiny",
        lowrank_model="tiny",
        processes_model="tiny",
        population_size=2,
        batch_size=2,
        max_completion_length=4,
        small_batch="2x1x4",
        curve=[],
        lowrank_populations=[2],
        steps=1,
        repetitions=1,
        grpo_micro_batch=2,
        colocate_model="tiny",
        colocate_setting="2x2x4",
        servers_model="tiny",
        servers_steps=1,
    ),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags (`argv`, default `sys.argv[1:]`) over the defaults of `--preset` (or `--full`)."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    known, _ = parser.parse_known_args(argv)
    preset = "full" if known.full else known.preset
    parser.set_defaults(**PRESETS[preset])  # flags given explicitly still win
    cli = parser.parse_args(argv)
    cli.preset = preset
    if cli.population_parallel and "processes" not in cli.sections:
        cli.sections = [*cli.sections, "processes"]
    return cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench.py",
        description=benchmarks.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", choices=list(PRESETS), default="default", help="Defaults for the flags below.")
    parser.add_argument("--full", action="store_true", help="The same as --preset full.")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--memory_model", choices=list(MODEL_SIZES), default="30M", help="Model of sections 1-2.")
    parser.add_argument(
        "--bf16_model",
        choices=list(MODEL_SIZES),
        default=None,
        help="Model of the bf16 memory setup (default: --memory_model on CUDA; 5M on CPU, where bf16 matrix products "
        "run several times slower than float32 without AVX512-BF16/AMX).",
    )
    parser.add_argument(
        "--memory_setups",
        nargs="+",
        choices=list(MEMORY_SETUPS),
        default=["float32", "bf16", "lowrank", "lowrank_split"],
        help="The setups of section 1 (lowrank_split: low-rank with a quarter of the members per generate call).",
    )
    parser.add_argument("--population_size", type=int, default=8, help="N of sections 1-2, 5, 8 (GRPO: group size).")
    parser.add_argument("--batch_size", type=int, default=64, help="Prompts per step (B) of sections 1-5, 8.")
    parser.add_argument(
        "--max_completion_length", type=int, default=16, help="Completion tokens (T), sections 1-5, 8."
    )
    parser.add_argument("--small_batch", default="4x4x16", help="NxBxT of the small-batch row of section 2.")
    parser.add_argument("--curve", nargs="*", default=["4x16x16", "4x64x32"], help="More NxBxT points of section 2.")
    parser.add_argument(
        "--steps",
        type=int,
        default=2,
        help="GRPO's training steps per memory run (its peak comes in the second, when AdamW's moments exist in the "
        "backward pass); ES runs one step, which already holds everything ES ever holds.",
    )
    parser.add_argument(
        "--grpo_micro_batch", type=int, default=8, help="GRPO's per_device_train_batch_size (TRL's default, 8)."
    )
    parser.add_argument("--repetitions", type=int, default=3, help="Timed repetitions in sections 2 and 3.")
    parser.add_argument("--lowrank_model", choices=list(MODEL_SIZES), default="5M", help="Model of section 3.")
    parser.add_argument("--lowrank_populations", type=int, nargs="+", default=[8, 32], help="N of section 3.")
    parser.add_argument("--lowrank_batch_size", type=int, default=None, help="B of section 3 (default: --batch_size).")
    parser.add_argument(
        "--lowrank_fullrank",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Also time the full-rank step in section 3 (its members one after another: N generate calls).",
    )
    parser.add_argument("--lowrank_rank", type=int, default=1)
    parser.add_argument("--lowrank_other_parameters", choices=["full", "frozen"], default="full")
    parser.add_argument("--vllm_model", default=None, help="Model of section 4 (default: the tiny test model).")
    parser.add_argument("--processes_model", choices=list(MODEL_SIZES), default="5M", help="Model of section 5.")
    parser.add_argument("--scale_model", choices=list(MODEL_SIZES), default="5M", help="Model of the N and B tables.")
    parser.add_argument("--colocate_model", choices=list(MODEL_SIZES), default="100M", help="Model of section 7.")
    parser.add_argument(
        "--colocate_setting",
        default="2x8x16",
        help="NxBxT of section 7 (the memory beyond the engine does not grow with N; B x T sizes generation's own).",
    )
    parser.add_argument("--servers_model", choices=list(MODEL_SIZES), default="5M", help="Model of section 8.")
    parser.add_argument(
        "--servers_steps", type=int, default=2, help="Timed steps per block of section 8 (--repetitions blocks each)."
    )
    parser.add_argument("--populations", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--model_sizes", choices=list(MODEL_SIZES), nargs="+", default=["5M", "30M"])
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=DEFAULT_SECTIONS)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default on CPU: 1, since on a shared machine OpenMP threads waiting for each other "
        "while other processes hold the cores make timings erratic; raise it on a dedicated machine).",
    )
    parser.add_argument("--population_parallel", action="store_true", help="The same as adding `processes`.")
    parser.add_argument(
        "--output",
        default=None,
        metavar="PATH",
        help="Also write the RESULT JSON, with the date and the command, to this file (a results file for the docs).",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a JSON spec: run one memory measurement
    return parser
