"""CoverageEvalCallback: ES and GRPO runs log the same held-out coverage metrics, without disturbing their own."""

import pytest
from scripts.fast_es import fast_es_config, fast_grpo_config
from trl import GRPOTrainer

from trl_es import ESTrainer
from trl_es.demo.run import DEMO_MODEL
from trl_es.tasks.arithmetic import arithmetic_dataset, arithmetic_reward, extract_answer
from trl_es.trainer.callbacks import CoverageEvalCallback

EXPECTED = {"eval_arithmetic_greedy_accuracy", "eval_arithmetic_pass@1", "eval_arithmetic_pass@2"}
EXPECTED |= {"eval_arithmetic_maj@1", "eval_arithmetic_maj@2", "eval_arithmetic_entropy"}


def _logged_coverage(trainer_class, config, tmp_path):
    trainer = trainer_class(
        model=str(DEMO_MODEL),
        reward_funcs=arithmetic_reward,
        args=config(tmp_path, max_completion_length=4),
        train_dataset=arithmetic_dataset("train", 16),
    )
    callback = CoverageEvalCallback(
        trainer, {"arithmetic": arithmetic_dataset("test", 8)}, extract_answer, ks=(1, 2), eval_steps=1
    )
    trainer.add_callback(callback)
    trainer.train()
    history = trainer.state.log_history
    return [entry for entry in history if "eval_arithmetic_pass@1" in entry], history, callback


@pytest.mark.parametrize("trainer_class, config", [(ESTrainer, fast_es_config), (GRPOTrainer, fast_grpo_config)])
def test_es_and_grpo_log_the_same_coverage_metrics_at_start_every_step_and_end(trainer_class, config, tmp_path):
    evaluations, history, _ = _logged_coverage(trainer_class, config, tmp_path)
    assert [entry["step"] for entry in evaluations] == [0, 1, 2]
    for entry in evaluations:
        assert EXPECTED <= entry.keys()
        assert 0.0 <= entry["eval_arithmetic_pass@1"] <= entry["eval_arithmetic_pass@2"] <= 1.0
        assert entry["eval_arithmetic_entropy"] > 0.0
    # the trainer's own step metrics are still logged, once per step, in entries of their own
    assert [entry["step"] for entry in history if "reward" in entry] == [1, 2]


def test_the_callback_measures_the_model_the_trainer_holds(tmp_path):
    evaluations, _, callback = _logged_coverage(ESTrainer, fast_es_config, tmp_path)
    remeasured = callback.evaluate()
    assert remeasured == {key: evaluations[-1][key] for key in remeasured}  # same weights, same seeds: same numbers


def test_an_eval_set_without_answers_is_refused_with_the_column_to_add(tmp_path):
    trainer = ESTrainer(
        model=str(DEMO_MODEL),
        reward_funcs=arithmetic_reward,
        args=fast_es_config(tmp_path),
        train_dataset=arithmetic_dataset("train", 16),
    )
    without_answers = arithmetic_dataset("test", 4).remove_columns("answer")
    with pytest.raises(ValueError, match="answer_column"):
        CoverageEvalCallback(trainer, without_answers, extract_answer)


def test_a_math_benchmark_is_measured_with_the_judge_given(tiny_model_path, prompts, tmp_path):
    """`judge=math_verify_judge` makes each set's judge from its answers and decides correctness (and Maj@k votes)."""
    from scripts.paths import REPO

    from trl_es.evaluation.benchmarks import benchmark_dataset, math_verify_judge
    from trl_es.testing import digit_fraction

    math500 = benchmark_dataset("math500", REPO / "tests" / "fixtures" / "benchmarks" / "math500.jsonl")
    judged = []

    def recording_judge(references):
        judge = math_verify_judge(references)

        def record(index, texts, ids):
            verdict = judge(index, texts, ids)
            judged.append((references[index], verdict))
            return verdict

        return record

    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=fast_es_config(tmp_path),
                        train_dataset=prompts)  # fmt: skip
    callback = CoverageEvalCallback(trainer, {"math500": math500}, judge=recording_judge, ks=(1, 2), max_new_tokens=6)
    metrics = callback.evaluate()
    assert {"eval_math500_pass@2", "eval_math500_maj@2", "eval_math500_greedy_accuracy"} <= metrics.keys()
    assert sorted({reference for reference, _ in judged}) == sorted(math500["answer"])  # every problem, its gold
    assert all(len(verdict.correct) in (1, 2) and verdict.answers is not None for _, verdict in judged)
    with pytest.raises(ValueError, match="extract_answer or judge, not both"):
        CoverageEvalCallback(trainer, math500, extract_answer, judge=math_verify_judge)
