"""The `evaluate` metric: hand-computed Pass@k / Maj@k, loaded offline through `evaluate.load` and directly."""

import pytest

evaluate = pytest.importorskip("evaluate")

from trl_es.evaluation.coverage_metric import COVERAGE_METRIC_PATH, Coverage  # noqa: E402

PREDICTIONS = [["4", "5", "4"], [None, "7", "7"]]
REFERENCES = ["4", "7"]


@pytest.mark.parametrize(
    "load", [lambda: evaluate.load(COVERAGE_METRIC_PATH), Coverage], ids=["evaluate.load", "class"]
)
def test_hand_computed_values(load):
    results = load().compute(predictions=PREDICTIONS, references=REFERENCES, k=[1, 2, 3])
    # prompt 1: 2 of 3 correct; prompt 2: 2 of 3 correct, the missing answer never wins a vote
    assert results["accuracy"] == pytest.approx(2 / 3)
    assert results["pass@1"] == pytest.approx(2 / 3)
    assert results["pass@2"] == results["pass@3"] == 1.0  # one wrong sample cannot fill 2 draws
    # Maj@2 over the 3 pairs: ("4","5") ties and the first seen wins, ("4","4"), ("5","4") -> 2/3; prompt 2 -> 1
    assert results["maj@2"] == pytest.approx((2 / 3 + 1) / 2)
    assert results["maj@3"] == 1.0


def test_k_above_the_samples_is_an_error_naming_the_fix():
    with pytest.raises(ValueError, match="Draw at least k samples per prompt"):
        Coverage().compute(predictions=PREDICTIONS, references=REFERENCES, k=[4])
