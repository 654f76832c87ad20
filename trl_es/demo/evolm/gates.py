"""The gates a comparison of the EVOLM demo's two arms must pass before any training, measured on the training
questions: without them, a result on `joint` against `null` would not say whether the asymmetry did it.

- rubric validity >= 0.98, greedy and at the rubric temperature, in both arms (an invalid rubric teaches nothing);
- answer accuracy (greedy) matched within 0.02 between the arms (the same answers to start from);
- the per-question net signal P(rubric right, answer wrong) − P(rubric wrong, answer right), rubrics sampled at the
  rubric temperature (what policy phases read) against greedy answers (what ES policy phases give): >= +0.15 on
  `joint`, within ±0.03 of 0 on `null`.

The verifier measures (`run.measure_arm`); nothing here reaches training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_RUBRIC_VALIDITY = 0.98
MAX_ACCURACY_GAP = 0.02
MIN_JOINT_SIGNAL = 0.15
MAX_NULL_SIGNAL = 0.03


class GateFailure(RuntimeError):
    """The arms fail a gate: no comparison of them is reported."""


@dataclass(frozen=True)
class Gate:
    name: str
    value: float
    target: str
    passed: bool


def gates(joint: dict, null: dict) -> list[Gate]:
    """The gates of a joint/null comparison, from each arm's `measure_arm`."""
    found = []
    for arm, measured in (("joint", joint), ("null", null)):
        for kind in ("greedy", "sampled"):
            validity = measured[f"rubric_valid_{kind}"]
            found.append(Gate(f"{arm} rubric validity ({kind})", validity, f">= {MIN_RUBRIC_VALIDITY}",
                              validity >= MIN_RUBRIC_VALIDITY))  # fmt: skip
    gap = abs(joint["answer_accuracy"] - null["answer_accuracy"])
    found.append(Gate("answer accuracy gap", gap, f"<= {MAX_ACCURACY_GAP}", gap <= MAX_ACCURACY_GAP))
    signal = joint["net_signal"]
    found.append(Gate("joint net signal", signal, f">= {MIN_JOINT_SIGNAL}", signal >= MIN_JOINT_SIGNAL))
    signal = null["net_signal"]
    found.append(Gate("null net signal", signal, f"within ±{MAX_NULL_SIGNAL}", abs(signal) <= MAX_NULL_SIGNAL))
    return found


def format_gates(found: Sequence[Gate]) -> str:
    rows = [f"{'gate':<34}{'value':>8}  {'target':<12} result"]
    rows += [f"{g.name:<34}{g.value:>8.3f}  {g.target:<12} {'pass' if g.passed else 'FAIL'}" for g in found]
    return "\n".join(rows)


def check_gates(found: Sequence[Gate]) -> None:
    """Raise a `GateFailure` naming every failed gate."""
    failed = [gate for gate in found if not gate.passed]
    if failed:
        raise GateFailure(
            "The arms fail their gates, so no comparison of them is reported: "
            + "; ".join(f"{g.name} = {g.value:.3f} (needs {g.target})" for g in failed)
            + ". Pretrain the arms again (python -m trl_es.demo.evolm.pretrain_arms) or check the toy's rates."
        )
