"""What ESTrainer is given, checked before anything is built (`trl_es.trainer.inputs`): bad input gets a clear error
that names the problem and the fix, at construction where it can be seen there (issue 16, points 4 and 6), instead of
failing deep inside TRL, transformers or numpy; and an unmodified GRPO script runs after the class swap."""

import pytest
from datasets import Dataset
from trl import GRPOConfig

from trl_es import ESTrainer
from trl_es.testing import digit_fraction


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_empty_dataset(tiny_model_path, make_config):
    with pytest.raises(ValueError, match="train_dataset is empty"):
        ESTrainer(
            model=tiny_model_path,
            reward_funcs=length_reward,
            args=make_config(),
            train_dataset=Dataset.from_dict({"prompt": []}),
        )


def test_conversational_prompts_without_a_chat_template(
    no_chat_template_model_path, conversational_prompts, make_config
):
    trainer = ESTrainer(
        model=no_chat_template_model_path,
        reward_funcs=length_reward,
        args=make_config(),
        train_dataset=conversational_prompts,
    )
    with pytest.raises(ValueError, match="chat_template"):
        trainer.train()


def test_tools_need_a_chat_template_that_can_call_them(tiny_model_path, prompts, make_config):
    """GRPO's own check, under ESTrainer: the tiny model's plain ChatML template renders no tool calls."""

    def calculator(expression: str) -> str:
        """Evaluate an expression.

        Args:
            expression: The expression.
        """
        return expression

    with pytest.raises(ValueError, match="does not support tool calling"):
        ESTrainer(
            model=tiny_model_path,
            reward_funcs=length_reward,
            args=make_config(),
            train_dataset=prompts,
            tools=[calculator],
        )


def test_args_of_the_wrong_type(tiny_model_path, prompts):
    with pytest.raises(TypeError, match="ESConfig or a GRPOConfig, got dict"):
        ESTrainer(model=tiny_model_path, reward_funcs=length_reward, args={"sigma": 0.1}, train_dataset=prompts)


def test_an_unmodified_grpo_script_runs_after_the_class_swap(tmp_path, tiny_model_path, prompts):
    # A GRPO script: GRPOConfig with GRPO settings, only the trainer class swapped.
    training_args = GRPOConfig(
        output_dir=str(tmp_path / "grpo-script"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        learning_rate=1e-6,
        beta=0.04,
        max_steps=1,
        bf16=False,
        use_cpu=True,
        report_to=[],
    )
    with pytest.warns(UserWarning, match="converted it to an ESConfig"):
        trainer = ESTrainer(
            model=tiny_model_path, reward_funcs=length_reward, args=training_args, train_dataset=prompts
        )
    trainer.args.population_size = 4  # keep the test fast; the script itself is unchanged
    trainer.train()
    assert trainer.state.global_step == 1
    assert trainer.args.learning_rate == 5e-4


def test_a_grpo_rollout_func_is_refused_where_no_member_is_written_where_it_generates(
    tiny_model_path, prompts, make_config
):
    """A rollout function with GRPO's signature generates with the trainer's model: low-rank members never are."""

    def rollout(prompts, trainer):
        raise AssertionError("never called")

    config = make_config(perturbation="lowrank", lowrank_rank=1)
    with pytest.raises(NotImplementedError, match=r"low-rank members .* Give it a `member` argument") as refused:
        ESTrainer(model=tiny_model_path, reward_funcs=length_reward, args=config, train_dataset=prompts,
                  rollout_func=rollout)  # fmt: skip
    assert "member.generate(prompt_ids)" in str(refused.value)


def test_a_dataset_smaller_than_one_step_is_refused_naming_both_numbers(tiny_model_path, make_config):
    three_prompts = Dataset.from_dict({"prompt": ["a", "b", "c"]})
    with pytest.raises(ValueError, match=r"train_dataset has 3 prompts, fewer than the 4 prompts of one ES step"):
        ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=make_config(), train_dataset=three_prompts)


@pytest.mark.parametrize("split", ["train_dataset", "eval_dataset"])
def test_a_dataset_without_a_prompt_column_is_refused_at_construction(tiny_model_path, prompts, make_config, split):
    questions = Dataset.from_dict({"question": [f"Item {k}:" for k in range(8)]})
    datasets = {"train_dataset": prompts, split: questions}
    with pytest.raises(ValueError, match=rf"{split} has no 'prompt' column \(its columns: \['question'\]\).*rename"):
        ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=make_config(), **datasets)


def test_an_iterable_dataset_without_a_prompt_column_is_refused_at_construction(tiny_model_path, make_config):
    """Issue 27: an IterableDataset whose features are unknown failed at step 1 with a KeyError."""
    from datasets import IterableDataset

    def questions():
        for k in range(8):
            yield {"question": f"Item {k}:"}

    stream = IterableDataset.from_generator(questions)
    assert stream.column_names is None  # the features are unknown until an example is read
    with pytest.raises(ValueError, match=r"train_dataset has no 'prompt' column \(its columns: \['question'\]\)"):
        ESTrainer(
            model=tiny_model_path, reward_funcs=digit_fraction, args=make_config(max_steps=1), train_dataset=stream
        )


@pytest.mark.parametrize("empty", ["", []])
def test_an_empty_prompt_or_conversation_is_refused_naming_it(tiny_model_path, make_config, empty):
    """Issue 27: an empty prompt or conversation gave an IndexError."""
    prompts = [f"Item {k}:" for k in range(8)] if empty == "" else [[{"role": "user", "content": "Hi"}]] * 8
    prompts[2] = empty
    dataset = Dataset.from_dict({"prompt": prompts})
    config = make_config(max_steps=2)  # two steps of 4 prompts: every prompt is met
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=dataset)
    with pytest.raises(ValueError, match=r"Prompts \[\d\] of this batch are empty .*every prompt needs text"):
        trainer.train()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("sigma", -1.0, "sigma must be a finite number > 0, got -1.0"), ("learning_rate", float("inf"), "got inf")],
)
def test_a_field_changed_after_construction_is_checked_when_training_starts(
    tiny_model_path, prompts, make_config, field, value, message
):
    """Issue 27: `sigma` and `learning_rate` set on `trainer.args` after construction were not re-checked."""
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=make_config(), train_dataset=prompts)
    setattr(trainer.args, field, value)
    with pytest.raises(ValueError, match=message):
        trainer.train()
    assert trainer.state.global_step == 0


def test_a_prompt_that_leaves_no_room_for_a_completion_is_refused_naming_it(tiny_model_path, make_config):
    """Issue 27: prompts longer than the model's positions ran silently. The tiny model has 512 positions."""
    prompts = [f"Item {k}:" for k in range(8)]
    prompts[1] = "Item " * 400
    config = make_config(max_steps=2, max_completion_length=6)
    dataset = Dataset.from_dict({"prompt": prompts})
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=dataset)
    refusal = (
        r"Prompt \d of this batch \('Item Item .*\) is \d+ tokens long .* context of 512 tokens holds prompts of "
        "at most 506 tokens"
    )
    with pytest.raises(ValueError, match=refusal):
        trainer.train()
    with pytest.raises(ValueError, match=refusal):  # evaluation too
        trainer.evaluate(eval_dataset=dataset.select(range(4)))
