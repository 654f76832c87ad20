"""The Hugging Face backend (`trl_es.backends.hf`): members' weights written into the trainer's model, which generates
with `model.generate`; `generate_rows` puts every row on its member's weights and samples it with its own seed."""

from dataclasses import replace

import torch
from scripts.ragged_rows import MEMBER_0, MEMBER_1, generated_alone, ragged_rows

from trl_es.backends.base import RowRequest
from trl_es.backends.hf import HFBackend, TokenIds
from trl_es.backends.sampling import SamplingSettings
from trl_es.core.master import MasterWeights
from trl_es.testing import build_tiny_qwen2

GREEDY = SamplingSettings(max_tokens=6)
SAMPLED = SamplingSettings(max_tokens=6, temperature=1.0)


def hf_backend(tokenizer, sigma=0.05) -> HFBackend:
    # A peaked model: its greedy choices are not near-ties that another batch's rounding could flip.
    model = build_tiny_qwen2(tokenizer, initializer_range=0.3).eval()
    parameters = dict(model.named_parameters())
    return HFBackend(model, parameters, MasterWeights(parameters, sigma), TokenIds.of(model, tokenizer))


def holds_the_centre(backend) -> bool:
    return all(torch.equal(param, backend.master.tensors[name]) for name, param in backend.parameters.items())


def test_hf_rows_of_ragged_members_generate_what_each_member_generates_alone(tokenizer):
    backend = hf_backend(tokenizer)
    rows = ragged_rows(lambda text: tokenizer(text)["input_ids"])
    together = backend.generate_rows(rows, GREEDY)
    assert holds_the_centre(backend)
    assert together == generated_alone(backend, rows, GREEDY)
    members_rows = [index for index, row in enumerate(rows) if row.member is not None]
    as_centre = backend.generate_center([rows[index].prompt_ids for index in members_rows], GREEDY, None)
    assert as_centre != [together[index] for index in members_rows]  # the members really generate differently


def test_hf_sampled_rows_sample_alike_whatever_else_is_in_the_call(tokenizer):
    backend = hf_backend(tokenizer)
    rows = ragged_rows(lambda text: tokenizer(text)["input_ids"])
    together = backend.generate_rows(rows, SAMPLED)
    assert together == [backend.generate_rows([row], SAMPLED)[0] for row in rows]
    assert together == backend.generate_rows(rows[::-1], SAMPLED)[::-1]
    assert backend.generate_rows([replace(row, seed=row.seed + 100) for row in rows], SAMPLED) != together
    assert holds_the_centre(backend)


def test_rows_of_any_member_with_one_prompt_and_seed_share_their_random_numbers(tokenizer):
    # sigma = 0: every member has the centre's weights, so only the random numbers can tell their rows apart.
    backend = hf_backend(tokenizer, sigma=0.0)
    prompt = tokenizer("Question: what is")["input_ids"]
    rows = [RowRequest(member, prompt, seed) for seed in (3, 4) for member in (MEMBER_0, None, MEMBER_1)]
    completions = backend.generate_rows(rows, SAMPLED)
    assert completions[0] == completions[1] == completions[2]
    assert completions[3] == completions[4] == completions[5]
    assert completions[0] != completions[3]


def test_greedy_rows_ignore_their_seeds(tokenizer):
    backend = hf_backend(tokenizer)
    rows = ragged_rows(lambda text: tokenizer(text)["input_ids"])
    unseeded = ragged_rows(lambda text: tokenizer(text)["input_ids"], seed=None)
    assert backend.generate_rows(rows, GREEDY) == backend.generate_rows(unseeded, GREEDY)
