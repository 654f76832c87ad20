"""Pass@k and Maj@k as a Hugging Face `evaluate` metric (needs `pip install trl-es[evaluate]`).

```python
>>> import evaluate
>>> from trl_es.evaluation.coverage_metric import COVERAGE_METRIC_PATH
>>> coverage = evaluate.load(COVERAGE_METRIC_PATH)  # or trl_es.evaluation.coverage_metric.Coverage()
>>> coverage.compute(predictions=[["4", "5", "4"], [None, "7", "7"]], references=["4", "7"], k=[1, 2])
{'pass@1': 0.6666666666666666, 'pass@2': 1.0, 'maj@1': 0.6666666666666666, 'maj@2': 0.8333333333333333,
 'accuracy': 0.6666666666666666}
```

Like `evaluate`'s `code_eval`, a prediction is the list of a prompt's sampled candidates; here they are extracted
answers (None where the verifier found none), compared with the reference as text. Imports are absolute so that
`evaluate.load` can copy this file into its module cache.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import evaluate

from trl_es.evaluation.metrics import maj_at_k, pass_at_k

COVERAGE_METRIC_PATH = str(Path(__file__).resolve())

_DESCRIPTION = """Coverage of sampled answers: unbiased Pass@k (Chen et al., 2021), Maj@k (majority vote over k of the
samples, averaged over k-subsets) and mean accuracy, over prompts with several sampled answers each."""

_CITATION = """@article{chen2021evaluating,
  title   = {Evaluating Large Language Models Trained on Code},
  author  = {Mark Chen and others},
  journal = {arXiv preprint arXiv:2107.03374},
  year    = {2021}
}"""

_INPUTS = """
Args:
    predictions (`list[list[str | None]]`): per prompt, the extracted answers of its n samples (None: no answer).
    references (`list[str]`): per prompt, the correct answer.
    k (`list[int]`, *optional*, defaults to `[1]`): the k of Pass@k and Maj@k; each at most the number of samples.
Returns:
    `pass@k` and `maj@k` for each k, and `accuracy` (the mean fraction of correct samples), each a mean over prompts.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _INPUTS)
class Coverage(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Value("string")), "references": datasets.Value("string")}
            ),
            reference_urls=["https://arxiv.org/abs/2107.03374"],
        )

    def _compute(self, predictions, references, k=(1,)):
        if not predictions:
            raise ValueError("predictions is empty: give one list of sampled answers per prompt.")
        ks = [k] if isinstance(k, int) else list(k)
        results = {}
        for value in ks:
            results[f"pass@{value}"] = _mean(
                pass_at_k(len(answers), sum(answer == ref for answer in answers), value)
                for answers, ref in zip(predictions, references, strict=True)
            )
        for value in ks:
            results[f"maj@{value}"] = _mean(
                maj_at_k(answers, ref, value) for answers, ref in zip(predictions, references, strict=True)
            )
        results["accuracy"] = _mean(
            sum(answer == ref for answer in answers) / len(answers)
            for answers, ref in zip(predictions, references, strict=True)
        )
        return results


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)
