import copy

import pytest
import torch
from transformers import LogitsProcessorList

from trl_es.backends.hf_lowrank import CommonRandomGumbel, lowrank_population
from trl_es.core.fitness import update_coefficients
from trl_es.core.lowrank import LowRankMasterWeights, lowrank_factors, lowrank_noise, lowrank_parameter_names
from trl_es.core.master import MasterWeights
from trl_es.core.noise import Member, population
from trl_es.testing import build_tiny_qwen2, build_tiny_tokenizer

SIGMA = 0.05
RANK = 2


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _model(tokenizer, tied=False, initializer_range=0.02):
    model = build_tiny_qwen2(tokenizer, initializer_range=initializer_range).eval()
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def _master(model, other_parameters="full", rank=RANK):
    parameters = dict(model.named_parameters())
    return LowRankMasterWeights.from_model(model, parameters, SIGMA, rank, other_parameters)


def _explicit_member(model, master, member):
    """A copy of `model` whose weights were written as `master + sign * sigma * eps`."""
    explicit = copy.deepcopy(model)
    parameters = dict(explicit.named_parameters())
    with torch.no_grad():
        for name, value in master.perturbed(member):
            parameters[name].copy_(value)
    return explicit


MEMBERS = [Member(11, 1), Member(11, -1), Member(12, 1)]  # an antithetic pair and a lone member


def test_factors_are_a_pure_function_of_seed_name_shape_and_rank():
    a, b = lowrank_factors(7, "layers.0.q_proj.weight", (64, 32), rank=4)
    lowrank_factors(8, "unrelated", (3, 5), rank=1)  # draws in between change nothing
    again = lowrank_factors(7, "layers.0.q_proj.weight", (64, 32), rank=4)
    assert a.shape == (64, 4) and b.shape == (32, 4) and a.dtype == b.dtype == torch.float32
    assert torch.equal(a, again[0]) and torch.equal(b, again[1])
    for other in [
        lowrank_factors(7, "layers.1.q_proj.weight", (64, 32), rank=4),  # same shape, other matrix
        lowrank_factors(8, "layers.0.q_proj.weight", (64, 32), rank=4),  # other seed
    ]:
        assert not torch.equal(a, other[0]) and not torch.equal(b, other[1])
    assert not torch.equal(a[:, :2], lowrank_factors(7, "layers.0.q_proj.weight", (64, 32), rank=2)[0])


def test_lowrank_noise_has_unit_variance_so_sigma_keeps_its_meaning():
    noise = lowrank_noise(3, "w", (256, 256), rank=4)
    assert abs(noise.std() - 1) < 0.1
    assert torch.linalg.matrix_rank(noise) == 4


def test_linear_and_embedding_weights_are_lowrank_norms_and_biases_are_not(tokenizer):
    names = lowrank_parameter_names(_model(tokenizer), [n for n, _ in _model(tokenizer).named_parameters()])
    assert "model.embed_tokens.weight" in names and "lm_head.weight" in names
    assert "model.layers.0.self_attn.q_proj.weight" in names and "model.layers.0.mlp.down_proj.weight" in names
    assert not any(name.endswith(("norm.weight", ".bias")) for name in names)


@pytest.mark.parametrize("other_parameters", ["full", "frozen"])
@pytest.mark.parametrize("tied", [False, True])
def test_member_logits_in_a_population_batch_equal_explicitly_perturbed_weights(tokenizer, other_parameters, tied):
    model = _model(tokenizer, tied=tied)
    master = _master(model, other_parameters)
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


def test_frozen_other_parameters_are_neither_perturbed_nor_updated(tokenizer):
    model = _model(tokenizer)
    master = _master(model, "frozen")
    norm = "model.layers.0.input_layernorm.weight"
    before = master.tensors[norm].clone()
    assert torch.equal(dict(master.perturbed(Member(1)))[norm], before)
    master.apply_update({1: 0.5}, lr=0.1, weight_decay=0.1)
    assert torch.equal(master.tensors[norm], before)


@pytest.mark.parametrize("sampling", ["greedy", "common_gumbel"])
def test_batched_population_generates_what_each_member_generates_alone(tokenizer, sampling):
    # A peaked model, so that greedy choices are not near-ties that float rounding could flip.
    model = _model(tokenizer, initializer_range=0.3)
    master = _master(model)
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


def test_common_gumbel_gives_every_member_the_same_random_numbers():
    processor = CommonRandomGumbel(seed=3, rows_per_member=2, temperature=0.7)
    scores = torch.zeros(6, 10)  # 3 members, equal logits: only the noise decides
    noisy = processor(torch.zeros(6, 4, dtype=torch.long), scores)
    assert torch.equal(noisy[0:2], noisy[2:4]) and torch.equal(noisy[0:2], noisy[4:6])
    assert not torch.equal(noisy[0], noisy[1])


@pytest.mark.parametrize("other_parameters", ["full", "frozen"])
def test_update_direction_is_the_explicit_sum_of_member_noise(tokenizer, other_parameters):
    model = _model(tokenizer)
    master = _master(model, other_parameters)
    members = population(base_seed=1, step=3, population_size=6, antithetic=True)
    shaped = torch.tensor([1.0, -0.5, 0.25, 0.25, -1.0, 2.0])
    coefficients = update_coefficients(members, shaped)  # antithetic pairs merged by seed
    full_rank = MasterWeights({name: t for name, t in master.tensors.items()}, SIGMA)
    for name, tensor in master.tensors.items():
        direction = master.update_direction(name, coefficients)
        if name in master.lowrank_names:
            expected = sum(
                m.sign * z / len(members) * lowrank_noise(m.seed, name, tensor.shape, RANK)
                for m, z in zip(members, shaped.tolist(), strict=True)
            )
        elif other_parameters == "full":
            expected = full_rank.update_direction(name, coefficients)
        else:
            expected = torch.zeros_like(tensor)
        torch.testing.assert_close(direction, expected, rtol=1e-5, atol=1e-6)

    start = {name: t.clone() for name, t in master.tensors.items()}
    norm = master.apply_update(coefficients, lr=1e-2)
    steps = {name: master.tensors[name] - start[name] for name in start}
    assert norm == pytest.approx(sum(float(s.double().pow(2).sum()) for s in steps.values()) ** 0.5, rel=1e-5)


def test_base_weights_are_bitwise_unchanged_after_the_population_also_after_an_error(tokenizer):
    model = _model(tokenizer)
    master = _master(model)
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
    model = _model(tokenizer)
    master = _master(model)
    with lowrank_population(model, master, MEMBERS, rows_per_member=2):
        with pytest.raises(ValueError, match="3 members x 2 rows per member = 6 rows"):
            model(torch.randint(3, len(tokenizer), (4, 5)))


def test_population_follows_a_model_cast_to_bf16_inside_the_context(tokenizer):
    # TRL's generate casts the model to bf16 (`args.bf16`) after the trainer would have entered the context.
    model = _model(tokenizer)
    master = _master(model)
    input_ids = torch.randint(3, len(tokenizer), (1, 5)).repeat(len(MEMBERS), 1)
    with torch.no_grad(), lowrank_population(model, master, MEMBERS, rows_per_member=1):
        expected = model(input_ids).logits
        model.to(torch.bfloat16)
        logits = model(input_ids).logits
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), expected, rtol=0.05, atol=0.1)  # bf16 rounding
