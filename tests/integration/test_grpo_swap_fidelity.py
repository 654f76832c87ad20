"""A GRPO script keeps working after `GRPOTrainer` -> `ESTrainer`: what surrounds the trainer (losses, best-model
selection, partial reward functions, batch settings, `beta`, sampled groups) behaves as the script expects."""

import logging

import pytest
import torch
from datasets import Dataset
from scripts.fast_es import MOVING, fast_grpo_config
from transformers import AutoModelForCausalLM, TrainerCallback
from trl import GRPOTrainer

from trl_es import ESConfig, ESTrainer


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


class LossSpy(TrainerCallback):
    """A callback keyed on the loss, as user callbacks are."""

    def __init__(self):
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            self.losses.append(logs["loss"])


def test_loss_is_minus_the_mean_fitness_and_train_loss_its_mean(tiny_model_path, prompts, make_config):
    spy = LossSpy()
    config = make_config(max_steps=4, logging_steps=2, gradient_accumulation_steps=2, **MOVING)
    trainer = ESTrainer(
        model=tiny_model_path, reward_funcs=length_reward, args=config, train_dataset=prompts, callbacks=[spy]
    )
    output = trainer.train()

    entries = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in entries] == [2, 4]
    for entry in entries:  # one value per micro-step would double it; a placeholder would be 0
        assert entry["loss"] == -entry["es/fitness/mean"]
        assert "grad_norm" not in entry
    assert entries[0]["loss"] != entries[1]["loss"]  # the fitness moved: the test can tell the steps apart
    assert spy.losses == [entry["loss"] for entry in entries]
    train_loss = trainer.state.log_history[-1]["train_loss"]
    assert train_loss == pytest.approx(sum(spy.losses) / len(spy.losses), rel=1e-12)  # equal logging windows
    assert output.training_loss == output.metrics["train_loss"] == train_loss


def test_load_best_model_at_end_with_defaults_loads_the_best_checkpoint(tiny_model_path, make_config):
    def reward(completions, split, trainer_state, **kwargs):
        if split[0] == "eval":  # the eval reward falls as training goes on, so the best checkpoint is the first
            return [-float(trainer_state.global_step)] * len(completions)
        return length_reward(completions)

    train = Dataset.from_dict({"prompt": [f"Item {k}:" for k in range(8)], "split": ["train"] * 8})
    test = Dataset.from_dict({"prompt": [f"Test {k}:" for k in range(4)], "split": ["eval"] * 4})
    config = make_config(
        max_steps=3,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        load_best_model_at_end=True,
        **MOVING,
    )
    trainer = ESTrainer(
        model=tiny_model_path, reward_funcs=reward, args=config, train_dataset=train, eval_dataset=test
    )
    trainer.train()

    evaluations = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
    assert [entry["eval_loss"] for entry in evaluations] == [1.0, 2.0, 3.0]
    assert all(entry["eval_loss"] == -entry["eval_reward"] for entry in evaluations)
    best = trainer.state.best_model_checkpoint
    assert best is not None and best.endswith("checkpoint-1") and trainer.state.best_metric == 1.0
    best_weights = weights(AutoModelForCausalLM.from_pretrained(best))
    last_weights = weights(AutoModelForCausalLM.from_pretrained(best.replace("checkpoint-1", "checkpoint-3")))
    assert not same_weights(best_weights, last_weights)  # training moved the model after the best checkpoint
    assert same_weights(weights(trainer.model), best_weights)
    assert trainer.evaluate()["eval_loss"] == 3.0  # the loaded best model evaluates (at global step 3)


def test_a_step_no_reward_function_scores_makes_no_update_warns_and_is_counted(
    tiny_model_path, prompts, make_config, caplog
):
    def first_domain_only(completions, trainer_state, **kwargs):
        # Scores one domain of a mixed dataset; the whole second step happens to come from the other one.
        if trainer_state.global_step == 1:
            return [None] * len(completions)
        return length_reward(completions)

    class Snapshots(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            after_step[state.global_step] = weights(model)

    trainer = ESTrainer(
        model=tiny_model_path,
        reward_funcs=first_domain_only,
        args=make_config(max_steps=3, **MOVING),
        train_dataset=prompts,
        callbacks=[Snapshots()],
    )
    after_step = {0: weights(trainer.model)}
    with caplog.at_level(logging.WARNING, logger="trl_es"):
        output = trainer.train()

    assert trainer.state.global_step == 3
    assert not same_weights(after_step[0], after_step[1]) and not same_weights(after_step[2], after_step[3])
    assert same_weights(after_step[1], after_step[2])  # the unscored step left the centre bitwise unchanged
    assert [r.message for r in caplog.records if "makes no update" in r.message][0].startswith("Step 2:")
    steps = [entry for entry in trainer.state.log_history if "es/skipped_steps" in entry]
    assert [entry["es/skipped_steps"] for entry in steps] == [0.0, 1.0, 1.0]
    skipped = steps[1]
    assert skipped["es/update_norm"] == 0.0 and skipped["loss"] is None and "es/fitness/mean" not in skipped
    scored_losses = [steps[0]["loss"], steps[2]["loss"]]
    assert output.training_loss == pytest.approx(sum(scored_losses) / 2, rel=1e-12)  # the skipped step left out


def test_steps_per_generation_is_converted_to_one_prompt_batch_per_update(tmp_path, tiny_model_path, prompts):
    batches = []

    def spy(prompts, completions, trainer_state, **kwargs):
        batches.append((trainer_state.global_step, list(prompts)))
        return length_reward(completions)

    grpo_args = fast_grpo_config(tmp_path / "grpo-script", steps_per_generation=2)  # one generation, two steps
    with pytest.warns(UserWarning, match="one update per prompt batch") as caught:
        trainer = ESTrainer(model=tiny_model_path, reward_funcs=spy, args=grpo_args, train_dataset=prompts)
    message = next(str(w.message) for w in caught if "one update per prompt batch" in str(w.message))
    assert "steps_per_generation=2" in message and "4 completions (2 prompts x num_generations=2)" in message
    assert (trainer.args.steps_per_generation, trainer.args.generation_batch_size) == (1, 4)
    trainer.args.population_size = 4  # keep the test fast; the script itself is unchanged
    trainer.train()

    assert trainer.state.global_step == 2
    step_prompts = {step: set(p) for step, p in batches}
    assert all(len(p) == 4 for _, p in batches)  # 2 prompts x 2 completions per member call
    assert len(step_prompts[0]) == len(step_prompts[1]) == 2
    assert not step_prompts[0] & step_prompts[1]  # every update draws its own prompts


def test_grpo_beta_builds_no_reference_model_and_grpo_loss_warnings_stay_out(
    tiny_model_path, prompts, make_config, caplog, tmp_path
):
    luspo_warning = "mirror the paper's setup"  # GRPOTrainer's warning for loss_type="luspo"
    with caplog.at_level(logging.WARNING):
        grpo = GRPOTrainer(
            model=tiny_model_path,
            reward_funcs=length_reward,
            args=fast_grpo_config(tmp_path / "grpo", beta=0.04, loss_type="luspo"),
            train_dataset=prompts,
        )
    assert grpo.ref_model is not None and luspo_warning in caplog.text  # what GRPO does with these settings
    caplog.clear()

    with pytest.warns(UserWarning, match="no KL penalty, so no reference model is built"):
        config = make_config(beta=0.04, loss_type="luspo")
    with caplog.at_level(logging.WARNING):
        trainer = ESTrainer(model=tiny_model_path, reward_funcs=length_reward, args=config, train_dataset=prompts)
    assert trainer.ref_model is None
    assert (trainer.args.beta, trainer.args.loss_type) == (0.04, "luspo")  # the user's values stay reported
    assert luspo_warning not in caplog.text
    trainer.train()
    assert trainer.state.global_step == 2


def test_a_converted_grpo_group_is_sampled_not_greedy(tmp_path, tiny_model_path, prompts):
    completions_seen = []

    def spy(prompts, completions, **kwargs):
        completions_seen.append(list(zip(prompts, completions, strict=True)))
        return length_reward(completions)

    with pytest.warns(UserWarning, match="samples num_generations=2 completions per prompt at temperature=1.0"):
        trainer = ESTrainer(
            model=tiny_model_path,
            reward_funcs=spy,
            args=fast_grpo_config(tmp_path / "grpo-script", max_steps=1),
            train_dataset=prompts,
        )
    assert isinstance(trainer.args, ESConfig) and (trainer.args.num_generations, trainer.args.temperature) == (2, 1.0)
    trainer.args.population_size = 4  # keep the test fast; the script itself is unchanged
    trainer.train()

    groups = {}
    for prompt, completion in completions_seen[0]:  # the first member's completions
        groups.setdefault(prompt, []).append(completion)
    assert len(groups) == 2 and all(len(group) == 2 for group in groups.values())
    assert any(len(set(group)) == 2 for group in groups.values())  # greedy decoding would repeat each completion


def test_an_es_config_converts_steps_per_generation_and_refuses_a_batch_that_splits_a_group(tmp_path):
    with pytest.warns(UserWarning, match=r"steps_per_generation=2 \(generation_batch_size=8\) becomes") as caught:
        config = ESConfig(str(tmp_path), steps_per_generation=2, per_device_train_batch_size=4)
    assert (config.steps_per_generation, config.generation_batch_size) == (1, 4)
    [warning] = [w for w in caught if "becomes steps_per_generation" in str(w.message)]
    assert warning.filename == __file__  # it points at the ESConfig(...) call, not at the dataclass's __init__
    with pytest.raises(ValueError, match="3 completions, which must be divisible by num_generations \\(2\\)"):
        ESConfig(
            str(tmp_path), generation_batch_size=6, per_device_train_batch_size=3, num_generations=2, temperature=1.0
        )
