"""The `trl-es` command."""

from __future__ import annotations

import argparse
import sys

from . import vllm_serve


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    result = run_demo(output_dir=args.output_dir, max_steps=args.max_steps, seed=args.seed)
    gain = result.reward_after - result.reward_before
    print(f"ES raised the held-out reward from {result.reward_before:.3f} to {result.reward_after:.3f} ({gain:+.3f}).")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trl-es", description="Evolution Strategies post-training for LLMs.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="Run ES on a tiny locally built model, offline on CPU (about a minute).")
    demo.add_argument("--output_dir", default=None, help="Where to write the models (default: a temporary folder).")
    demo.add_argument("--max_steps", type=int, default=60, help="Number of ES steps.")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
