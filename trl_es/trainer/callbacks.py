"""Held-out coverage evaluation during training, with the same metric names for ESTrainer and GRPOTrainer."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from datasets import Dataset
from transformers import Trainer, TrainerCallback

from ..evaluation.coverage import Judge, Sampler
from ..evaluation.trainer_coverage import grpo_sampler, measure_trainer
from .es_trainer import ESTrainer


def sampler_for(trainer) -> Sampler:
    """The generation path of `trainer`, holding the weights it trains: an ESTrainer's centre (its vLLM engine or
    server when it has one), a GRPOTrainer's policy."""
    return trainer.coverage_sampler() if isinstance(trainer, ESTrainer) else grpo_sampler(trainer)


class CoverageEvalCallback(TrainerCallback):
    r"""
    A [`~transformers.TrainerCallback`] that measures the trainer's model on held-out sets every `eval_steps` steps
    and logs `eval_<set>_greedy_accuracy`, `eval_<set>_pass@k`, `eval_<set>_maj@k` and `eval_<set>_entropy`.

    ES and GRPO runs given the same callback log the same names on the same sets, so their coverage can be compared
    step by step; with ESTrainer the model measured is the centre of the population (its weights between steps), not
    a perturbed member. Completions come from the trainer's vLLM engine when it generates with one (colocate; an
    ESTrainer's server too), and from `model.generate` otherwise; the prompts are split across processes.

    Usage:
    ```python
    >>> trainer = ESTrainer(...)  # or GRPOTrainer(...)
    >>> sets = {"arithmetic": test_set, "held_out": other_set}
    >>> trainer.add_callback(CoverageEvalCallback(trainer, sets, extract_answer, eval_steps=50))
    >>> # A math benchmark from a local file, checked with math-verify
    >>> from trl_es import benchmark_dataset, math_verify_judge
    >>> math500 = benchmark_dataset("math500", "MATH-500/test.jsonl")
    >>> trainer.add_callback(CoverageEvalCallback(trainer, {"math500": math500}, judge=math_verify_judge))
    ```

    Args:
        trainer ([`~transformers.Trainer`]):
            The trainer whose model is measured and through which the metrics are logged.
        eval_datasets (`Dataset` or `dict[str, Dataset]`):
            Held-out sets with a `prompt` column (plain text or conversational) and, with `extract_answer`, an answer
            column. One dataset logs `eval_<metric>`; a dict logs `eval_<name>_<metric>` for each set (e.g. a target
            task and a task that measures forgetting).
        extract_answer (`Callable[[str], str | None]`, *optional*):
            The verifier's answer extractor: completion text to answer (None when there is none), compared with the
            answer column as text; the answers also decide Maj@k. Without it, a completion is correct when the
            trainer's reward functions give it a positive weighted reward (the sets' other columns reach them as in
            training), and Maj@k is not logged.
        ks (`Sequence[int]`, *optional*, defaults to `(1, 4, 16)`):
            The k of Pass@k and Maj@k.
        samples_per_prompt (`int`, *optional*):
            Sampled completions per prompt; defaults to `max(ks)`.
        temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature of the Pass@k samples (greedy accuracy is measured separately).
        max_new_tokens (`int`, *optional*):
            Completion length; defaults to the trainer's `max_completion_length`.
        eval_steps (`int`, *optional*):
            Evaluate every this many steps; defaults to the trainer's `eval_steps`, else `logging_steps`. Also at the
            start (step 0) and at the end of training.
        answer_column (`str`, *optional*, defaults to `"answer"`):
            Column of the reference answers.
        judge (`Callable[[Sequence[str]], Judge]`, *optional*):
            Instead of `extract_answer`: a factory that makes the judge of a set from its reference answers, e.g.
            `trl_es.evaluation.benchmarks.math_verify_judge` (math-verify's equivalence, with Maj@k).
    """

    def __init__(
        self,
        trainer,
        eval_datasets: Dataset | dict[str, Dataset],
        extract_answer: Callable[[str], str | None] | None = None,
        ks: Sequence[int] = (1, 4, 16),
        samples_per_prompt: int | None = None,
        temperature: float = 1.0,
        max_new_tokens: int | None = None,
        eval_steps: int | None = None,
        answer_column: str = "answer",
        judge: Callable[[Sequence[str]], Judge] | None = None,
    ):
        if judge is not None and extract_answer is not None:
            raise ValueError("Give extract_answer or judge, not both: each decides which completions are correct.")
        self.trainer = trainer
        named = eval_datasets if isinstance(eval_datasets, dict) else {"": eval_datasets}
        for name, dataset in named.items():
            missing = {"prompt", *([answer_column] if extract_answer or judge else [])} - set(dataset.column_names)
            if missing:
                raise ValueError(
                    f"Eval set {name or 'eval_datasets'!r} has no column {sorted(missing)}; it needs `prompt` and, to "
                    f"compare extracted answers, `{answer_column}` (set answer_column= to use another column)."
                )
        self.eval_datasets = named
        self.extract_answer = extract_answer
        self.judge = judge
        self.ks = tuple(ks)
        self.samples_per_prompt = samples_per_prompt or max(self.ks)
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens or trainer.args.max_completion_length
        self.eval_steps = eval_steps or trainer.args.eval_steps or trainer.args.logging_steps
        self.answer_column = answer_column
        self._last_step = -1

    def on_train_begin(self, args, state, control, **kwargs):
        self._evaluate(state)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.eval_steps == 0:
            self._evaluate(state)

    def on_train_end(self, args, state, control, **kwargs):
        self._evaluate(state)

    def evaluate(self) -> dict[str, float]:
        """Measure the trainer's model on every eval set now; returns the metrics under their logged names."""
        metrics = {}
        for name, dataset in self.eval_datasets.items():
            sampler = sampler_for(self.trainer)
            report = measure_trainer(
                self.trainer,
                sampler,
                dataset,
                self.ks,
                self.extract_answer,
                answer_column=self.answer_column,
                judge=self.judge,
                samples_per_prompt=self.samples_per_prompt,
                temperature=self.temperature,
                max_new_tokens=self.max_new_tokens,
            )
            prefix = f"eval_{name}_" if name else "eval_"
            metrics.update({prefix + metric: value for metric, value in report.as_dict().items()})
        return metrics

    def _evaluate(self, state) -> None:
        if state.global_step == self._last_step:  # the last step's on_step_end already measured it
            return
        self._last_step = state.global_step
        # Trainer.log, not the trainer's own: GRPOTrainer.log (and so ESTrainer's) would flush the step metrics it is
        # averaging into this entry. Logging also clears `should_log`, which the step's own log still needs.
        should_log = self.trainer.control.should_log
        Trainer.log(self.trainer, self.evaluate())
        self.trainer.control.should_log = should_log
