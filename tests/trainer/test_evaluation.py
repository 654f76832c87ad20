"""ESTrainer's own coverage evaluation (`eval_ks`): the centre is measured, through the trainer's generation path."""

import pytest
from scripts.fast_es import fast_es_config

from trl_es import ESTrainer
from trl_es.demo.run import DEMO_MODEL
from trl_es.evaluation.coverage import coverage_report
from trl_es.tasks.arithmetic import arithmetic_dataset, arithmetic_reward, extract_answer

TEST_SET = arithmetic_dataset("test", 8)


def _trainer(tmp_path, **overrides):
    config = fast_es_config(tmp_path, max_completion_length=4, eval_strategy="steps", eval_steps=1,
                            per_device_eval_batch_size=4, eval_ks=[1, 2], **overrides)  # fmt: skip
    return ESTrainer(
        model=str(DEMO_MODEL),
        reward_funcs=arithmetic_reward,
        args=config,
        train_dataset=arithmetic_dataset("train", 16),
        eval_dataset=TEST_SET,
    )


def test_each_evaluation_logs_coverage_of_the_centre(tmp_path):
    # a visible sigma: had a perturbed member been measured instead of the centre, the numbers would differ
    trainer = _trainer(tmp_path, eval_answer_extractor="trl_es.tasks.arithmetic.extract_answer", sigma=0.05)
    trainer.train()
    evaluations = [entry for entry in trainer.state.log_history if "eval_pass@1" in entry]
    assert [entry["step"] for entry in evaluations] == [1, 2]
    names = {"eval_greedy_accuracy", "eval_pass@1", "eval_pass@2", "eval_maj@1", "eval_maj@2", "eval_entropy"}
    assert names <= evaluations[-1].keys()
    assert "eval_reward" in evaluations[-1]  # GRPO's own evaluation still runs beside it
    # The centre after training, measured directly with the same seed and samples, gives the logged numbers.
    direct = coverage_report(trainer.model, trainer.processing_class, TEST_SET["prompt"], TEST_SET["answer"],
                             extract_answer, ks=(1, 2), samples_per_prompt=2, max_new_tokens=4,
                             seed=trainer.args.seed)  # fmt: skip
    assert {f"eval_{name}": value for name, value in direct.as_dict().items()} == {
        name: evaluations[-1][name] for name in names
    }


def test_without_an_extractor_correctness_is_a_positive_reward_and_maj_is_not_logged(tmp_path):
    by_reward = _trainer(tmp_path / "reward").evaluate()
    by_answer = _trainer(
        tmp_path / "answer", eval_answer_extractor="trl_es.tasks.arithmetic.extract_answer"
    ).evaluate()
    # arithmetic_reward is 1 exactly when the extracted answer is right, so both judges agree.
    for name in ("eval_greedy_accuracy", "eval_pass@1", "eval_pass@2", "eval_entropy"):
        assert by_reward[name] == by_answer[name]
    assert "eval_maj@1" in by_answer and "eval_maj@1" not in by_reward


def test_an_extractor_that_cannot_be_imported_is_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match="eval_answer_extractor='trl_es.tasks.arithmetic.no_such_function'"):
        _trainer(tmp_path, eval_answer_extractor="trl_es.tasks.arithmetic.no_such_function")


@pytest.mark.parametrize("ks", [[], [0, 2]])
def test_bad_ks_are_refused_with_an_example(tmp_path, ks):
    with pytest.raises(ValueError, match=r"eval_ks must be a non-empty list of integers >= 1 \(e.g. \[1, 4, 16\]\)"):
        fast_es_config(tmp_path, eval_ks=ks)


def test_every_evaluation_of_a_run_samples_and_resets_environments_with_the_same_seed(tmp_path):
    """Checkpoints are compared on the same episodes: an evaluation at a later step of unchanged weights samples the
    same completions (common random numbers across evaluations)."""
    recorded = []

    def record(completions: list, **kwargs) -> list[float]:
        recorded.append(list(completions))
        return [0.0] * len(completions)

    args = fast_es_config(tmp_path, temperature=1.0, per_device_eval_batch_size=8, max_completion_length=8)
    data = {"train_dataset": arithmetic_dataset("train", 16), "eval_dataset": arithmetic_dataset("test", 8)}
    trainer = ESTrainer(model=str(DEMO_MODEL), reward_funcs=record, args=args, **data)
    trainer.evaluate()
    trainer.state.global_step = 7
    trainer.evaluate()
    assert len(recorded) == 2 and recorded[0] == recorded[1]
    assert len(set(recorded[0])) > 1  # sampled, not greedy
