"""`trl-es evolm-demo`: EVOLM on the embedded joint model and on its null control, offline on CPU (a few minutes).

Training sees questions only; the verifier measures the policy and its rubrics on held-out problems before and after.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..demo.evolm.settings import EVOLM_DEMO

    parser.add_argument("--output_dir", default=None, help="Where to write the runs (default: a temporary folder).")
    parser.add_argument("--method", choices=["es", "grpo"], default="es", help="How both roles train (ES or GRPO).")
    parser.add_argument("--schedule", choices=["coevolve", "sequential", "static"], default=EVOLM_DEMO.schedule)
    parser.add_argument("--rounds", type=int, default=EVOLM_DEMO.rounds, help="Policy phases (and rubric phases).")
    parser.add_argument("--policy_steps", type=int, default=EVOLM_DEMO.policy_steps, help="Steps per policy phase.")
    parser.add_argument("--rubric_steps", type=int, default=EVOLM_DEMO.rubric_steps, help="Steps per rubric phase.")
    parser.add_argument(
        "--models", nargs="+", choices=["joint", "null"], default=["joint", "null"], help="Which embedded models."
    )
    parser.add_argument("--num_held_out", type=int, default=EVOLM_DEMO.num_held_out, help="Held-out problems.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the noise, the sampling and the data order.")
    parser.add_argument(
        "--kl_anchor_beta", type=float, default=EVOLM_DEMO.kl_anchor_beta, help="KL anchor of ES phases (0: none)."
    )
    parser.add_argument("--live_rubrics", action="store_true", help="Policy phases read rubrics written per step.")


def run(args: argparse.Namespace) -> int:
    from ..demo.evolm.run import run_evolm_demo
    from ..demo.evolm.settings import with_overrides

    settings = with_overrides(
        policy_method=args.method,
        rubric_method=args.method,
        schedule=args.schedule,
        rounds=args.rounds,
        policy_steps=args.policy_steps,
        rubric_steps=args.rubric_steps,
        num_held_out=args.num_held_out,
        kl_anchor_beta=args.kl_anchor_beta,
        live_rubrics=args.live_rubrics or None,
    )
    run_evolm_demo(args.output_dir, settings, models=args.models, seed=args.seed)
    return 0
