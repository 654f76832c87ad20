"""The gates a joint/null comparison must pass before any training, and the refusal that names the failed ones."""

import re

import pytest

from trl_es.demo.evolm.gates import GateFailure, check_gates, format_gates, gates

PASSING = {
    "joint": {"rubric_valid_greedy": 1.0, "rubric_valid_sampled": 0.99, "answer_accuracy": 0.55, "net_signal": 0.3},
    "null": {"rubric_valid_greedy": 0.99, "rubric_valid_sampled": 0.98, "answer_accuracy": 0.56, "net_signal": -0.01},
}


def test_arms_with_valid_rubrics_matched_answers_and_the_stated_signals_pass():
    found = gates(PASSING["joint"], PASSING["null"])
    assert len(found) == 7 and all(gate.passed for gate in found)
    check_gates(found)
    assert format_gates(found).count("pass") == 7


@pytest.mark.parametrize(
    ("arm", "key", "value", "failed"),
    [
        ("joint", "rubric_valid_sampled", 0.97, "joint rubric validity (sampled) = 0.970 (needs >= 0.98)"),
        ("null", "answer_accuracy", 0.58, "answer accuracy gap = 0.030 (needs <= 0.02)"),
        ("joint", "net_signal", 0.14, "joint net signal = 0.140 (needs >= 0.15)"),
        ("null", "net_signal", 0.04, "null net signal = 0.040 (needs within ±0.03)"),
    ],
)
def test_a_failed_gate_stops_the_comparison_naming_it(arm, key, value, failed):
    measured = {name: dict(values) for name, values in PASSING.items()}
    measured[arm][key] = value
    found = gates(measured["joint"], measured["null"])
    assert [gate.passed for gate in found].count(False) == 1
    with pytest.raises(GateFailure, match=re.escape(f"no comparison of them is reported: {failed}.")):
        check_gates(found)
