import inspect

import pytest
import torch
from transformers import AutoModelForCausalLM
from trl import GRPOTrainer

from trl_es import ESTrainer
from trl_es.core.fitness import member_fitness, objective_rewards, shape_fitness, update_coefficients
from trl_es.core.noise import parameter_noise, population


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_accepts_every_grpo_trainer_parameter_by_name_then_its_own():
    grpo = inspect.signature(GRPOTrainer.__init__).parameters
    es = inspect.signature(ESTrainer.__init__).parameters
    assert list(es) == [*grpo, "kl_probe_prompts"]
    for name, parameter in grpo.items():
        assert es[name].default == parameter.default, name


def test_model_given_as_path_or_object(tiny_model_path, prompts, make_config):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    for source in (tiny_model_path, model):
        trainer = ESTrainer(
            model=source, reward_funcs=length_reward, args=make_config(max_steps=1), train_dataset=prompts
        )
        trainer.train()
        assert trainer.state.global_step == 1


def test_zero_learning_rate_leaves_every_parameter_bitwise_unchanged_in_bf16(tiny_model_path, prompts, make_config):
    # Restore is a copy from the float32 master, never "add then subtract" (which changes bf16 weights).
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.bfloat16)
    before = snapshot(model)
    config = make_config(learning_rate=0.0, sigma=0.05, max_steps=3)
    ESTrainer(model=model, reward_funcs=length_reward, args=config, train_dataset=prompts).train()
    after = snapshot(model)
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_equal_rewards_give_a_zero_update(tiny_model_path, prompts, make_config):
    trainer = ESTrainer(
        model=tiny_model_path, reward_funcs=constant_reward, args=make_config(sigma=0.1), train_dataset=prompts
    )
    before = snapshot(trainer.model)
    trainer.train()
    after = snapshot(trainer.model)
    assert all(torch.equal(before[name], after[name]) for name in before)
    logged = trainer.state.log_history[0]
    assert logged["es/update_norm"] == 0.0 and logged["es/fitness/std"] == 0.0


def test_weight_decay_is_decoupled_and_applied_to_the_master(tiny_model_path, prompts, make_config):
    config = make_config(learning_rate=0.1, weight_decay=0.5, max_steps=1)
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=constant_reward, args=config, train_dataset=prompts)
    before = snapshot(trainer.model)
    trainer.train()
    for name, param in trainer.model.named_parameters():
        assert torch.allclose(param, before[name] * (1 - 0.1 * 0.5), rtol=0, atol=1e-7)


@pytest.mark.parametrize("noise_seed", [None, 7])  # None: the members come from `seed`
def test_one_step_applies_lr_times_mean_of_shaped_fitness_times_noise(
    tiny_model_path, prompts, make_config, noise_seed
):
    rewards_seen = []

    def recording_reward(completions, **kwargs):
        rewards = length_reward(completions)
        rewards_seen.append(rewards)
        return rewards

    config = make_config(
        population_size=4, sigma=0.5, learning_rate=0.01, max_steps=1, temperature=1.0, noise_seed=noise_seed
    )
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=recording_reward, args=config, train_dataset=prompts)
    before = snapshot(trainer.model)
    trainer.train()

    members = population(config.seed if noise_seed is None else noise_seed, step=0, population_size=4)
    fitness = torch.tensor([sum(r) / len(r) for r in rewards_seen])  # one reward call per member, in order
    z = shape_fitness(fitness, "zscore")
    assert z.abs().sum() > 0, "the members must differ for this test to check anything"
    for name, param in trainer.model.named_parameters():
        direction = sum((z[i].item() / 4) * parameter_noise(m.seed, name, param.shape) for i, m in enumerate(members))
        assert torch.allclose(param, before[name] + 0.01 * direction, atol=1e-6), name
    assert update_coefficients(members, z)  # same coefficients the trainer used, by construction


def parity_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


@pytest.mark.parametrize(
    "objective",
    [
        {"normalize_fitness_per_prompt": True},
        {"fitness_pass_at_k": 2},
        {"fitness_pass_at_k": 2, "normalize_fitness_per_prompt": True},
    ],
)
def test_the_update_follows_the_fitness_objective_asked_for(tiny_model_path, prompts, make_config, objective):
    """Members' fitness from each prompt's standardised rewards or their Pass@2 (successes: odd lengths, above the
    default threshold 0), not their mean reward."""
    rewards_seen = []

    def recording_reward(completions, **kwargs):
        rewards = parity_reward(completions)
        rewards_seen.append(rewards)
        return rewards

    settings = dict(population_size=4, sigma=0.5, learning_rate=0.01, max_steps=1, temperature=1.0)
    config = make_config(**settings, num_generations=2, per_device_train_batch_size=8, **objective)
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=recording_reward, args=config, train_dataset=prompts)
    before = snapshot(trainer.model)
    trainer.train()

    rewards = torch.tensor(rewards_seen)  # (members, 4 prompts x 2 generations): one reward call per member
    chosen = objective_rewards(
        rewards, 2, objective.get("fitness_pass_at_k"), 0.0, objective.get("normalize_fitness_per_prompt", False)
    )
    z = shape_fitness(member_fitness(chosen), "zscore")
    assert not torch.allclose(z, shape_fitness(member_fitness(rewards), "zscore")), "the objective must matter here"
    members = population(config.seed, step=0, population_size=4)
    for name, param in trainer.model.named_parameters():
        direction = sum((z[i].item() / 4) * parameter_noise(m.seed, name, param.shape) for i, m in enumerate(members))
        assert torch.allclose(param, before[name] + 0.01 * direction, atol=1e-6), name


def test_sampling_members_share_random_numbers(tiny_model_path, prompts, make_config):
    # With a negligible sigma every member has (numerically) the same policy; only common random numbers make
    # their sampled completions identical.
    completions_per_member = []

    def recording_reward(completions, **kwargs):
        completions_per_member.append(completions)
        return [0.0] * len(completions)

    config = make_config(sigma=1e-12, temperature=1.0, max_steps=1, max_completion_length=12)
    ESTrainer(model=tiny_model_path, reward_funcs=recording_reward, args=config, train_dataset=prompts).train()
    assert len(completions_per_member) == 4
    assert all(c == completions_per_member[0] for c in completions_per_member)


def test_members_differ_when_perturbed(tiny_model_path, prompts, make_config):
    completions_per_member = []

    def recording_reward(completions, **kwargs):
        completions_per_member.append(completions)
        return [0.0] * len(completions)

    config = make_config(sigma=0.5, max_steps=1, max_completion_length=12)
    ESTrainer(model=tiny_model_path, reward_funcs=recording_reward, args=config, train_dataset=prompts).train()
    assert len({tuple(c) for c in completions_per_member}) > 1


def test_logs_grpo_metric_names_plus_es_metrics_and_no_grad_norm(tiny_model_path, prompts, make_config):
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=length_reward, args=make_config(), train_dataset=prompts)
    trainer.train()
    logged = trainer.state.log_history[0]
    for key in (
        "reward",
        "reward_std",
        "rewards/length_reward/mean",
        "rewards/length_reward/std",
        "completions/mean_length",
        "learning_rate",
        "es/fitness/mean",
        "es/fitness/std",
        "es/fitness/min",
        "es/fitness/max",
        "es/update_norm",
        "es/param_distance",
        "es/time/generate",
        "es/time/perturb",
        "es/time/update",
        "es/time/check",
        "step_time",
    ):
        assert key in logged, key
    assert logged["loss"] == -logged["es/fitness/mean"] and "grad_norm" not in logged  # the loss ES minimises
    assert logged["learning_rate"] == 5e-4
    assert logged["es/param_distance"] > 0


def test_the_consistency_checks_seconds_are_logged_on_the_steps_that_check_and_zero_on_the_others(
    tiny_model_path, prompts, make_config
):
    config = make_config(max_steps=4, consistency_check_steps=3, logging_steps=1)
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=length_reward, args=config, train_dataset=prompts)
    trainer.train()

    checks = [h["es/time/check"] for h in trainer.state.log_history if "es/time/check" in h]
    assert len(checks) == 4 and checks[0] == checks[1] == 0.0  # steps 1 and 2 check nothing
    assert checks[2] > 0 and checks[3] > 0  # step 3, and the last step


def test_peft_evolves_only_the_adapter(tiny_model_path, prompts, make_config):
    peft = pytest.importorskip("peft")
    config = make_config(sigma=0.1, learning_rate=0.05, max_steps=1, temperature=1.0)
    trainer = ESTrainer(
        model=tiny_model_path,
        reward_funcs=length_reward,
        args=config,
        train_dataset=prompts,
        peft_config=peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    )
    before = snapshot(trainer.model)
    trainer.train()
    changed = {name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])}
    assert changed, "the adapter should move"
    assert all("lora_" in name for name in changed)


def test_evaluate_scores_the_centre_model_without_moving_it(tiny_model_path, prompts, make_config):
    trainer = ESTrainer(
        model=tiny_model_path,
        reward_funcs=length_reward,
        args=make_config(max_steps=1, per_device_eval_batch_size=4),
        train_dataset=prompts,
        eval_dataset=prompts,
    )
    trainer.train()
    before = snapshot(trainer.model)
    metrics = trainer.evaluate()
    assert metrics["eval_reward"] > 0 and "eval_rewards/length_reward/mean" in metrics
    assert metrics["eval_loss"] == -metrics["eval_reward"]  # the training loss's meaning: minus the mean reward
    assert all(torch.equal(p, before[name]) for name, p in trainer.model.named_parameters())


def test_log_completions_records_the_best_member_of_the_step(tiny_model_path, prompts, make_config):
    pandas = pytest.importorskip("pandas")
    config = make_config(max_steps=1, log_completions=True, sigma=0.5, temperature=1.0)
    trainer = ESTrainer(model=tiny_model_path, reward_funcs=length_reward, args=config, train_dataset=prompts)
    trainer.train()
    table = pandas.read_parquet(f"{config.output_dir}/completions/completions_00001.parquet")
    assert len(table) == 4  # the prompts of one step, answered by one member
    best_fitness = trainer.state.log_history[0]["es/fitness/max"]
    assert table["length_reward"].mean() == pytest.approx(best_fitness)
    assert (table["advantage"] > 0).all()  # the best member's shaped fitness
