"""The `model.generate` low-rank backend (`trl_es.backends.hf_lowrank`): a whole population in one batched call,
each member's rows generating as its explicitly perturbed weights would, rows of ragged counts too (`generate_rows`);
and ESTrainer with `perturbation="lowrank"` on it: batched calls score like one member per call, the update is the
full-rank sum of the members' low-rank terms, and checkpoints resume."""

import copy
from pathlib import Path

import pytest
import torch
from scripts.fast_es import MOVING
from scripts.ragged_rows import generated_alone, ragged_rows
from scripts.tiny_lowrank import lowrank_master, lowrank_model
from transformers import LogitsProcessorList

from trl_es import ESTrainer
from trl_es.backends.gumbel import CommonRandomGumbel
from trl_es.backends.hf import HFBackend, TokenIds
from trl_es.backends.hf_lowrank import HFLowRankBackend, lowrank_population
from trl_es.backends.sampling import SamplingSettings
from trl_es.core.fitness import shape_fitness
from trl_es.core.lowrank import lowrank_noise
from trl_es.core.noise import Member, parameter_noise, population
from trl_es.testing import digit_fraction, digit_prompts

MEMBERS = [Member(11, 1), Member(11, -1), Member(12, 1)]  # an antithetic pair and a lone member
GREEDY_ROWS = SamplingSettings(max_tokens=6)
SAMPLED_ROWS = SamplingSettings(max_tokens=6, temperature=1.0)


def _explicit_member(model, master, member):
    """A copy of `model` whose weights were written as `master + sign * sigma * eps`."""
    explicit = copy.deepcopy(model)
    parameters = dict(explicit.named_parameters())
    with torch.no_grad():
        for name, value in master.perturbed(member):
            parameters[name].copy_(value)
    return explicit


@pytest.mark.parametrize("other_parameters", ["full", "frozen"])
@pytest.mark.parametrize("tied", [False, True])
def test_member_logits_in_a_population_batch_equal_explicitly_perturbed_weights(tokenizer, other_parameters, tied):
    model = lowrank_model(tokenizer, tied=tied)
    master = lowrank_master(model, other_parameters)
    rows_per_member = 2
    torch.manual_seed(0)
    input_ids = torch.randint(3, len(tokenizer), (rows_per_member, 6))
    with torch.no_grad():
        base = model(input_ids).logits
        with lowrank_population(model, master, MEMBERS, rows_per_member):
            batched = model(input_ids.repeat(len(MEMBERS), 1)).logits
        for index, member in enumerate(MEMBERS):
            expected = _explicit_member(model, master, member)(input_ids).logits
            got = batched[index * rows_per_member : (index + 1) * rows_per_member]
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            assert (got - base).abs().max() > 1e-3  # the member is really perturbed


@pytest.mark.parametrize("sampling", ["greedy", "common_gumbel"])
def test_batched_population_generates_what_each_member_generates_alone(tokenizer, sampling):
    # A peaked model, so that greedy choices are not near-ties that float rounding could flip.
    model = lowrank_model(tokenizer, initializer_range=0.3)
    master = lowrank_master(model)
    prompts = ["Question: what is", "The quick brown fox jumps"]  # different lengths: left padding is exercised
    members = population(base_seed=0, step=0, population_size=4, antithetic=True)

    def generate(model, rows_per_member, copies):
        batch = tokenizer(prompts * copies, return_tensors="pt", padding=True)
        processors = LogitsProcessorList(
            [CommonRandomGumbel(seed=5, rows_per_member=rows_per_member)] if sampling == "common_gumbel" else []
        )
        ids = model.generate(**batch, do_sample=False, max_new_tokens=8, logits_processor=processors)
        return ids[:, batch["input_ids"].shape[1] :]

    with torch.no_grad(), lowrank_population(model, master, members, rows_per_member=len(prompts)):
        batched = generate(model, len(prompts), len(members))
    alone = [generate(_explicit_member(model, master, member), len(prompts), 1) for member in members]
    for index, expected in enumerate(alone):
        assert batched[index * len(prompts) : (index + 1) * len(prompts)].tolist() == expected.tolist()
    assert len({tuple(ids.flatten().tolist()) for ids in alone}) > 1  # members really answer differently


def lowrank_backend(tokenizer, members_per_call=None) -> HFLowRankBackend:
    # A peaked model, so that greedy choices are not near-ties that another batch's rounding could flip.
    model = lowrank_model(tokenizer, initializer_range=0.3)
    tokens = TokenIds.of(model, tokenizer)
    return HFLowRankBackend(model, dict(model.named_parameters()), lowrank_master(model), tokens, members_per_call)


@pytest.mark.parametrize("members_per_call", [None, 2, 1])
def test_lowrank_rows_of_ragged_members_generate_what_each_member_generates_alone(tokenizer, members_per_call):
    # All members in one call (the centre's and member 1's rows padded to member 0's three), two per call, one.
    backend = lowrank_backend(tokenizer, members_per_call)
    before = {name: param.detach().clone() for name, param in backend.model.state_dict().items()}
    rows = ragged_rows(lambda text: tokenizer(text)["input_ids"])
    together = backend.generate_rows(rows, GREEDY_ROWS)
    assert not any(module._forward_hooks for module in backend.model.modules())
    assert all(torch.equal(param, before[name]) for name, param in backend.model.state_dict().items())
    assert together == generated_alone(backend, rows, GREEDY_ROWS)
    members_rows = [index for index, row in enumerate(rows) if row.member is not None]
    as_centre = backend.generate_center([rows[index].prompt_ids for index in members_rows], GREEDY_ROWS, None)
    assert as_centre != [together[index] for index in members_rows]  # the members really generate differently


def test_lowrank_sampled_rows_draw_what_explicitly_written_weights_draw(tokenizer):
    backend = lowrank_backend(tokenizer)
    explicit = HFBackend(backend.model, backend.parameters, backend.master, backend.tokens)  # writes each member
    rows = ragged_rows(lambda text: tokenizer(text)["input_ids"])
    together = backend.generate_rows(rows, SAMPLED_ROWS)
    assert together == explicit.generate_rows(rows, SAMPLED_ROWS)
    assert together == [backend.generate_rows([row], SAMPLED_ROWS)[0] for row in rows]


def test_base_weights_are_bitwise_unchanged_after_the_population_also_after_an_error(tokenizer):
    model = lowrank_model(tokenizer)
    master = lowrank_master(model)
    before = {name: param.detach().clone() for name, param in model.state_dict().items()}
    input_ids = torch.randint(3, len(tokenizer), (2, 5))
    base = model(input_ids).logits.detach()
    with torch.no_grad(), lowrank_population(model, master, MEMBERS, rows_per_member=1):
        model(input_ids.repeat(3, 1)[:3])
    with pytest.raises(RuntimeError, match="reward crashed"):
        with torch.no_grad(), lowrank_population(model, master, MEMBERS, rows_per_member=1):
            model(input_ids.repeat(3, 1)[:3])
            raise RuntimeError("reward crashed")
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert not any(module._forward_hooks for module in model.modules())
    assert torch.equal(model(input_ids).logits, base)


def test_a_batch_that_is_not_whole_members_is_refused(tokenizer):
    model = lowrank_model(tokenizer)
    master = lowrank_master(model)
    with lowrank_population(model, master, MEMBERS, rows_per_member=2):
        with pytest.raises(ValueError, match="3 members x 2 rows per member = 6 rows"):
            model(torch.randint(3, len(tokenizer), (4, 5)))


def test_population_follows_a_model_cast_to_bf16_inside_the_context(tokenizer):
    # TRL's generate casts the model to bf16 (`args.bf16`) after the trainer would have entered the context.
    model = lowrank_model(tokenizer)
    master = lowrank_master(model)
    input_ids = torch.randint(3, len(tokenizer), (1, 5)).repeat(len(MEMBERS), 1)
    with torch.no_grad(), lowrank_population(model, master, MEMBERS, rows_per_member=1):
        expected = model(input_ids).logits
        model.to(torch.bfloat16)
        logits = model(input_ids).logits
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), expected, rtol=0.05, atol=0.1)  # bf16 rounding


LOWRANK = dict(perturbation="lowrank", lowrank_rank=2)


def _train(model_path, config, reward=digit_fraction, dataset=None):
    trainer = ESTrainer(model=model_path, reward_funcs=reward, args=config, train_dataset=dataset or digit_prompts(8))
    trainer.train()
    return trainer


def _fitness_log(trainer):
    keys = ("es/fitness/mean", "es/fitness/std", "es/fitness/min", "es/fitness/max")
    return [tuple(entry[key] for key in keys) for entry in trainer.state.log_history if "es/fitness/mean" in entry]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_the_whole_population_in_one_call_scores_like_one_member_per_call(peaked_model_path, make_config, temperature):
    # Sampled rows draw common random numbers per row, so batching members changes nothing either way.
    settings = dict(**LOWRANK, sigma=0.05, learning_rate=0.01, max_steps=2, temperature=temperature)
    together = _train(peaked_model_path, make_config(**settings))
    one_by_one = _train(peaked_model_path, make_config(**settings, population_batch_size=1))
    assert _fitness_log(together) == _fitness_log(one_by_one)
    assert any(std > 0 for _, std, _, _ in _fitness_log(together))  # the members really differed
    for name, master in together.population.master.tensors.items():
        assert torch.allclose(master, one_by_one.population.master.tensors[name], atol=1e-6), name


def test_one_step_applies_the_full_rank_sum_of_the_members_lowrank_terms(peaked_model_path, make_config):
    rewards_seen = []

    def recording_reward(completions, **kwargs):
        rewards = digit_fraction(completions)
        rewards_seen.extend(rewards)
        return rewards

    config = make_config(**LOWRANK, population_size=4, sigma=0.5, learning_rate=0.01, max_steps=1, temperature=1.0)
    trainer = ESTrainer(model=peaked_model_path, reward_funcs=recording_reward, args=config,
                        train_dataset=digit_prompts(8))  # fmt: skip
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()

    members = population(config.seed, step=0, population_size=4)
    fitness = torch.tensor(rewards_seen).view(4, -1).mean(dim=1)  # one batched call, rows member-major
    z = shape_fitness(fitness, "zscore")
    assert z.abs().sum() > 0, "the members must differ for this test to check anything"
    master = trainer.population.master
    assert "lm_head.weight" in master.lowrank_names and "model.norm.weight" not in master.lowrank_names
    for name, param in trainer.model.named_parameters():
        if name in master.lowrank_names:
            noise = [lowrank_noise(m.seed, name, param.shape, rank=2) for m in members]
        else:  # lowrank_other_parameters="full": norms get full-rank noise
            noise = [parameter_noise(m.seed, name, param.shape) for m in members]
        direction = sum((z[i].item() / 4) * noise[i] for i in range(4))
        assert torch.allclose(param, before[name] + 0.01 * direction, atol=1e-6), name


def test_frozen_other_parameters_stay_bitwise_unchanged(peaked_model_path, make_config):
    trainer = _train(peaked_model_path, make_config(**LOWRANK, **MOVING, lowrank_other_parameters="frozen"))
    start = ESTrainer(model=peaked_model_path, reward_funcs=digit_fraction, args=make_config(**LOWRANK),
                      train_dataset=digit_prompts(8)).model  # fmt: skip
    start_weights = dict(start.named_parameters())
    for name, param in trainer.model.named_parameters():
        if name in trainer.population.master.lowrank_names:
            assert not torch.equal(param, start_weights[name]), name
        else:
            assert torch.equal(param, start_weights[name]), name


def test_a_lowrank_run_resumes_bit_for_bit(peaked_model_path, make_config):
    config = make_config(**LOWRANK, **MOVING, max_steps=4, save_strategy="steps", save_steps=2)
    uninterrupted = _train(peaked_model_path, config)
    resumed = ESTrainer(
        model=peaked_model_path, reward_funcs=digit_fraction, args=config, train_dataset=digit_prompts(8)
    )
    resumed.train(resume_from_checkpoint=str(Path(config.output_dir) / "checkpoint-2"))
    for name, master in uninterrupted.population.master.tensors.items():
        assert torch.equal(master, resumed.population.master.tensors[name]), name
