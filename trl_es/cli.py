"""The `trl-es` command.

`trl-es es`, `trl-es es-then-grpo` and `trl-es grpo-then-es` launch the training scripts of `trl_es/scripts/` through
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

from . import vllm_serve


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(output_dir=args.output_dir, max_steps=args.max_steps, seed=args.seed)
    return 0


@dataclass(frozen=True)
class TrainingCommand:
    """A subcommand that launches `trl_es/scripts/<script>.py` with accelerate; `fixed` are script arguments that the
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
            "grpo-then-es",
            "sequential",
            "GRPO, then ES from the GRPO model (SequentialTrainer); --grpo_overrides sets fields of GRPO only.",
            (("order", "grpo-then-es"),),
        ),
    )
}


def accelerate_configs_dir() -> Path:
    """Our accelerate configs: shipped inside the wheel, or in the repository's `examples/accelerate_configs/`."""
    packaged = Path(__file__).parent / "accelerate_configs"
    return packaged if packaged.is_dir() else Path(__file__).parents[1] / "examples" / "accelerate_configs"


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
    module = importlib.import_module(f"trl_es.scripts.{command.script}")
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
        "demo", help="ES on the embedded arithmetic model, offline on CPU: held-out Pass@k before and after."
    )
    demo.add_argument("--output_dir", default=None, help="Where to write the models (default: a temporary folder).")
    demo.add_argument("--max_steps", type=int, default=200, help="Number of ES steps.")
    demo.add_argument("--seed", type=int, default=0, help="Seed of the noise and of the data order.")
    demo.set_defaults(handler=_demo)

    serve = commands.add_parser(
        "vllm-serve",
        help="Start a vLLM server with the ES worker extension (for ESConfig(use_vllm=True, vllm_mode='server')).",
        description=vllm_serve.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    vllm_serve.add_arguments(serve)
    serve.set_defaults(handler=vllm_serve.serve)

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
