"""The tiny model and low-rank master of the low-rank tests (tests/core/test_lowrank.py and
tests/backends/test_hf_lowrank.py); the tokenizer is conftest.py's `tokenizer` fixture."""

from trl_es.core.lowrank import LowRankMasterWeights
from trl_es.testing import build_tiny_qwen2

SIGMA = 0.05
RANK = 2


def lowrank_model(tokenizer, tied=False, initializer_range=0.02):
    model = build_tiny_qwen2(tokenizer, initializer_range=initializer_range).eval()
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def lowrank_master(model, other_parameters="full", rank=RANK):
    parameters = dict(model.named_parameters())
    return LowRankMasterWeights.from_model(model, parameters, SIGMA, rank, other_parameters)
