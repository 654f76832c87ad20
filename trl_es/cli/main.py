"""The `trl-es` command.

`trl-es es`, `trl-es es-then-grpo` and `trl-es grpo-then-es` launch the training scripts of `trl_es/cli/` through
`accelerate launch`, the way `trl grpo` launches TRL's: the script's parser reads its flags (and `--config` YAML);
the flags it does not take go to `accelerate launch`, with `--accelerate_config NAME_OR_PATH` turned into
`--config_file` (names: the YAML files of `examples/accelerate_configs/`, shipped in the wheel).
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import env, evolm_demo, vllm_serve


def _demo(args: argparse.Namespace) -> int:
    if args.task == "tools":
        from ..demo.tools import TOOLS_DEMO, run_tools_demo

        run_tools_demo(output_dir=args.output_dir, max_steps=args.max_steps or TOOLS_DEMO.max_steps, seed=args.seed)
        return 0
    from ..demo.run import DEMO, run_demo

    run_demo(output_dir=args.output_dir, max_steps=args.max_steps or DEMO.max_steps, seed=args.seed)
    return 0


def _analyze_shift(args: argparse.Namespace) -> int:
    from ..evaluation.analysis import format_shift, parameter_shift

    shift = parameter_shift(args.base, args.tuned, module_depth=args.module_depth)
    print(format_shift(shift))
    if args.plot:
        from ..evaluation.plots import plot_shift_histogram

        print(f"|Δθ| histogram: {plot_shift_histogram(shift, args.plot)}")
    return 0


def _evaluation_settings(args: argparse.Namespace) -> dict:
    """The keyword arguments of `evaluate_checkpoint` that the flags set."""
    vllm_kwargs = {"dtype": args.vllm_dtype, "gpu_memory_utilization": args.vllm_gpu_memory_utilization}
    if args.vllm_max_model_len is not None:
        vllm_kwargs["max_model_len"] = args.vllm_max_model_len
    return {
        "ks": args.ks,
        "samples_per_prompt": args.samples_per_prompt,
        "temperature": args.temperature,
        "seed": args.seed,
        "backend": args.backend,
        **({"vllm_kwargs": vllm_kwargs} if args.backend == "vllm" else {}),
    }


def _load_eval_datasets(args: argparse.Namespace, specs: list[str]) -> list:
    from ..evaluation.comparison import load_eval_dataset

    return [load_eval_dataset(spec, args.num_problems, args.max_new_tokens) for spec in specs]


def _analyze_sparsify(args: argparse.Namespace) -> int:
    from ..evaluation.analysis import sparsify

    paths = sparsify(args.base, args.tuned, args.percent, args.output_dir)
    for percent, path in zip(args.percent, paths, strict=True):
        print(f"{percent:g}% of the smallest |Δθ| reset to the base: {path}")
    if args.evaluate:
        _analyze_evaluate(args, [args.base, args.tuned, *paths], args.evaluate)
    return 0


def _analyze_evaluate(args: argparse.Namespace, checkpoints: list, specs: list[str]) -> dict:
    """Evaluate `checkpoints` on the datasets `specs`, print the table with intervals, and write `--json`."""
    import json

    from ..evaluation.comparison import compare_checkpoints, comparison_json, comparison_statistics, format_comparison

    settings = _evaluation_settings(args)
    reports = compare_checkpoints(checkpoints, _load_eval_datasets(args, specs), **settings)
    statistics = comparison_statistics(reports, draws=args.bootstrap_draws, seed=args.bootstrap_seed)
    print(format_comparison(reports, statistics))
    if args.json:
        settings = {**settings, "bootstrap_draws": args.bootstrap_draws, "bootstrap_seed": args.bootstrap_seed}
        written = comparison_json(reports, statistics, {**settings, "datasets": specs, "checkpoints": checkpoints})
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(written, indent=2) + "\n")
        print(f"Intervals, paired tests and per-problem values: {args.json}")
    return reports


def _analyze_compare(args: argparse.Namespace) -> int:
    from ..evaluation.comparison import checkpoint_labels

    checkpoints = [args.base, *args.tuned]
    reports = _analyze_evaluate(args, checkpoints, args.dataset)
    if args.plot:
        from ..evaluation.plots import plot_pass_at_k

        for dataset, by_checkpoint in reports.items():
            path = Path(args.plot)
            path = path if len(reports) == 1 else path.with_name(f"{path.stem}-{Path(dataset).name}{path.suffix}")
            curves = {
                label: report.pass_at_k
                for label, report in zip(checkpoint_labels(checkpoints), by_checkpoint.values(), strict=True)
            }
            print(f"Pass@k curves on {dataset}: {plot_pass_at_k(curves, path, title=f'Pass@k on {dataset}')}")
    return 0


def _analyze_curves(args: argparse.Namespace) -> int:
    from ..evaluation.analysis import training_curves
    from ..evaluation.comparison import checkpoint_labels
    from ..evaluation.plots import plot_training_curves

    labels = checkpoint_labels(args.runs)
    runs = {label: training_curves(run, args.keys) for label, run in zip(labels, args.runs, strict=True)}
    for label, curves in runs.items():
        for key, (steps, values) in curves.items():
            print(f"{label:<24}{key:<20}{len(steps):>5} points, last (step {steps[-1]}): {values[-1]:.4f}")
    print(f"Training curves: {plot_training_curves(runs, args.plot)}")
    return 0


def _add_analyze_parser(commands) -> None:
    from ..evaluation.benchmarks import BENCHMARKS
    from ..evaluation.comparison import BACKENDS
    from ..evaluation.intervals import DRAWS

    analyze = commands.add_parser(
        "analyze", help="Parameter shift, sparsification, forgetting (Pass@k / Maj@k) and training curves."
    )
    tools = analyze.add_subparsers(dest="tool", required=True)
    evaluation = argparse.ArgumentParser(add_help=False)
    evaluation.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="The k of Pass@k and Maj@k.")
    evaluation.add_argument(
        "--samples_per_prompt", type=int, default=None, help="Samples per problem (default: the largest k)."
    )
    evaluation.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature.")
    evaluation.add_argument("--num_problems", type=int, default=128, help="Held-out problems per dataset.")
    evaluation.add_argument(
        "--max_new_tokens", type=int, default=None, help="Tokens per completion (default: the dataset's)."
    )
    evaluation.add_argument(
        "--seed", type=int, default=1234, help="Sampling seed, one for every checkpoint (the paired test needs it)."
    )
    evaluation.add_argument(
        "--backend",
        choices=BACKENDS,
        default="hf",
        help="Generate with `model.generate` (hf) or an in-process vLLM engine of each checkpoint (vllm).",
    )
    evaluation.add_argument("--vllm_dtype", default="auto", help="With --backend vllm: the engine's dtype.")
    evaluation.add_argument(
        "--vllm_gpu_memory_utilization", type=float, default=0.9, help="With --backend vllm: GPU memory share."
    )
    evaluation.add_argument(
        "--vllm_max_model_len", type=int, default=None, help="With --backend vllm: context length (default: model's)."
    )
    evaluation.add_argument(
        "--bootstrap_draws", type=int, default=DRAWS, help="Bootstrap draws and sign-flip patterns of the intervals."
    )
    evaluation.add_argument("--bootstrap_seed", type=int, default=0, help="Seed of the bootstrap and sign flips.")
    evaluation.add_argument(
        "--json", default=None, help="Write the intervals, paired tests and per-problem values to this JSON file."
    )
    datasets_help = (
        "`arithmetic`; a math benchmark as NAME:PATH, NAME one of "
        f"{', '.join(BENCHMARKS)} and PATH its local JSONL/JSON/parquet file in the public format (e.g. "
        "math500:test.jsonl gsm8k:test.parquet); or a local dataset folder / JSON file with `prompt` and `answer` "
        "(or `solution`)."
    )

    shift = tools.add_parser("shift", help="‖θ_tuned − θ_base‖ / ‖θ_base‖ overall and per module; |Δθ| histogram.")
    shift.add_argument("base", help="The base checkpoint (a Hugging Face model folder).")
    shift.add_argument("tuned", help="The tuned checkpoint.")
    shift.add_argument("--module_depth", type=int, default=4, help="Dotted parts that name a module.")
    shift.add_argument("--plot", default=None, help="Write the |Δθ| histogram to this PNG file.")
    shift.set_defaults(handler=_analyze_shift)

    sparsify = tools.add_parser(
        "sparsify", parents=[evaluation], help="Reset the p%% smallest |Δθ| to the base; save (and evaluate) each."
    )
    sparsify.add_argument("base", help="The base checkpoint.")
    sparsify.add_argument("tuned", help="The tuned checkpoint.")
    sparsify.add_argument("--percent", type=float, nargs="+", default=[50, 78, 90], help="Percentages to reset.")
    sparsify.add_argument("--output_dir", required=True, help="Where to write the sparse-<p> checkpoints.")
    sparsify.add_argument("--evaluate", nargs="*", default=[], help=f"Datasets to evaluate them on: {datasets_help}")
    sparsify.set_defaults(handler=_analyze_sparsify)

    compare = tools.add_parser(
        "compare",
        parents=[evaluation],
        help="Forgetting: greedy accuracy, Pass@k and Maj@k of base and tuned, with bootstrap intervals and a paired "
        "sign-flip test of each difference.",
    )
    compare.add_argument("base", help="The base checkpoint.")
    compare.add_argument("tuned", nargs="+", help="Tuned checkpoints, compared with the base.")
    compare.add_argument("--dataset", nargs="+", default=["arithmetic"], help=f"Held-out datasets: {datasets_help}")
    compare.add_argument("--plot", default=None, help="Write the Pass@k curves to this PNG file.")
    compare.set_defaults(handler=_analyze_compare)

    curves = tools.add_parser("curves", help="Plot logged metrics against the step from runs' trainer_state.json.")
    curves.add_argument("runs", nargs="+", help="Run output folders (or checkpoint folders).")
    curves.add_argument("--keys", nargs="+", default=None, help="Logged metrics (default: reward, es/fitness/mean).")
    curves.add_argument("--plot", required=True, help="The PNG file to write.")
    curves.set_defaults(handler=_analyze_curves)


@dataclass(frozen=True)
class TrainingCommand:
    """A subcommand that launches `trl_es/cli/<script>.py` with accelerate; `fixed` are script arguments that the
    command sets (the order of the stages)."""

    name: str
    script: str
    help: str
    fixed: tuple[tuple[str, str], ...] = ()


TRAINING_COMMANDS = {
    command.name: command
    for command in (
        TrainingCommand("es", "es", "Train with ES (ESTrainer), launched with accelerate; flags as for `trl grpo`."),
        TrainingCommand(
            "es-then-grpo",
            "sequential",
            "ES, then GRPO from the ES model (SequentialTrainer); --grpo_overrides sets fields of GRPO only.",
            (("order", "es-then-grpo"),),
        ),
        TrainingCommand(
            "evolm",
            "evolm",
            "EVOLM: one model as policy and rubric generator under a frozen judge, each phase ES or GRPO.",
        ),
        TrainingCommand(
            "grpo-then-es",
            "sequential",
            "GRPO, then ES from the GRPO model (SequentialTrainer); --grpo_overrides sets fields of GRPO only.",
            (("order", "grpo-then-es"),),
        ),
    )
}


def accelerate_configs_dir() -> Path:
    """Our accelerate configs: shipped inside the wheel, or in the repository's `examples/accelerate_configs/`."""
    package = Path(__file__).parents[1]
    packaged = package / "accelerate_configs"
    return packaged if packaged.is_dir() else package.parent / "examples" / "accelerate_configs"


def accelerate_config_names() -> list[str]:
    return sorted(path.stem for path in accelerate_configs_dir().glob("*.yaml"))


def resolve_accelerate_config_argument(launch_args: list[str]) -> list[str]:
    """Turn `--accelerate_config NAME_OR_PATH` into accelerate's `--config_file PATH`.

    A path to a file is used as it is; a name is one of our configs (`single_gpu`, `multi_gpu`, `multi_node`,
    `deepspeed_zero2`, `deepspeed_zero3`).
    """
    if "--accelerate_config" not in launch_args:
        return launch_args
    index = launch_args.index("--accelerate_config")
    names = ", ".join(accelerate_config_names())
    if index + 1 >= len(launch_args):
        raise ValueError(f"--accelerate_config needs a value: one of {names}, or the path to an accelerate YAML file.")
    value = launch_args[index + 1]
    path = Path(value) if Path(value).is_file() else accelerate_configs_dir() / f"{value}.yaml"
    if not path.is_file():
        raise ValueError(
            f"Unknown accelerate config {value!r}: it is neither a file nor one of trl-es's configs ({names}). Pass "
            "one of those names, or the path to an accelerate YAML file (`accelerate config` writes one)."
        )
    return ["--config_file", str(path), *launch_args[:index], *launch_args[index + 2 :]]


def _without_subsequence(args: list[str], subsequence: list[str]) -> list[str]:
    """`args` less the items of `subsequence`, matched in order."""
    remaining = iter(subsequence)
    current = next(remaining, None)
    kept = []
    for item in args:
        if current is not None and item == current:
            current = next(remaining, None)
        else:
            kept.append(item)
    return kept


def accelerate_launch_args(command: TrainingCommand, argv: list[str]) -> list[str]:
    """The arguments of `accelerate launch` for `trl-es <command> <argv>`: launch flags, script path, script flags.

    The script's parser reads `argv` (and a `--config` YAML) first, so a bad value fails here, before any process
    starts, and `-h` prints the script's help. What it does not take goes to accelerate: flags of the command line,
    and YAML keys that are no field of the script (`num_processes: 8`, `accelerate_config: multi_gpu`).
    """
    for name, value in command.fixed:
        if f"--{name}" in argv:
            raise ValueError(f"`trl-es {command.name}` sets --{name} {value}; drop --{name}.")
    module = importlib.import_module(f"trl_es.cli.{command.script}")
    parser = module.make_parser(prog=f"trl-es {command.name}")
    parser.set_defaults(**dict(command.fixed))  # what `-h` shows
    *_, config_remaining, cli_remaining = parser.parse_args_and_config(
        argv, return_remaining_strings=True, separate_remaining_strings=True
    )
    launch_args = resolve_accelerate_config_argument(config_remaining + cli_remaining)
    fixed = [item for name, value in command.fixed for item in (f"--{name}", value)]
    script_args = [*_without_subsequence(argv, cli_remaining), *fixed]
    return [*launch_args, module.__file__, *script_args]


def launch_training(command: TrainingCommand, argv: list[str]) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser

    accelerate_args = launch_command_parser().parse_args(accelerate_launch_args(command, argv))
    try:
        launch_command(accelerate_args)
    except subprocess.CalledProcessError as error:  # the script printed its own traceback
        return error.returncode
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trl-es", description="Evolution Strategies post-training for LLMs.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="ES on an embedded model, offline on CPU: held-out Pass@k (arithmetic) or episode success (tools) before "
        "and after.",
    )
    demo.add_argument(
        "--task",
        choices=("arithmetic", "tools"),
        default="arithmetic",
        help="arithmetic: word problems answered in one turn, scored by a verifier. tools: price questions that the "
        "model answers by calling an environment's lookup and answer tools, scored by the environment.",
    )
    demo.add_argument("--output_dir", default=None, help="Where to write the models (default: a temporary folder).")
    demo.add_argument(
        "--max_steps", type=int, default=None, help="Number of ES steps (default: 200 for arithmetic, 60 for tools)."
    )
    demo.add_argument("--seed", type=int, default=0, help="Seed of the noise and of the data order.")
    demo.set_defaults(handler=_demo)

    evolm = commands.add_parser(
        "evolm-demo",
        help="EVOLM on the embedded joint model and its null control, offline on CPU: held-out measurements.",
        description=evolm_demo.__doc__,
    )
    evolm_demo.add_arguments(evolm)
    evolm.set_defaults(handler=evolm_demo.run)

    serve = commands.add_parser(
        "vllm-serve",
        help="Start a vLLM server with the ES worker extension (for ESConfig(use_vllm=True, vllm_mode='server')).",
        description=vllm_serve.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    vllm_serve.add_arguments(serve)
    serve.set_defaults(handler=vllm_serve.serve)

    environment = commands.add_parser("env", help="Print the environment for a bug report: `trl env`, plus trl-es.")
    environment.set_defaults(handler=env.print_env)

    _add_analyze_parser(commands)

    for command in TRAINING_COMMANDS.values():
        # The script's own parser reads the flags (see accelerate_launch_args), `-h` included.
        commands.add_parser(command.name, help=command.help, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    known, _ = parser.parse_known_args(argv)
    command = TRAINING_COMMANDS.get(known.command)
    if command is not None:
        try:
            return launch_training(command, argv[argv.index(command.name) + 1 :])
        except ValueError as error:
            parser.exit(2, f"trl-es {command.name}: error: {error}\n")
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
