"""The digests that compare two float32 masters bitwise (trainer and vLLM server, or the owners of a split master)."""

import torch

from trl_es.core.consistency import combined_digest, master_digest, tensor_digests

TENSORS = {"embed.weight": torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), "norm.weight": torch.ones(4)}


def test_the_master_digest_changes_with_any_bit_name_dtype_or_shape():
    digest = master_digest(TENSORS)
    assert master_digest({name: tensor.clone() for name, tensor in TENSORS.items()}) == digest
    flipped = TENSORS["embed.weight"].clone()
    flipped.view(torch.int32)[3, 2] ^= 1  # the lowest mantissa bit of one element
    changes = [
        {**TENSORS, "embed.weight": flipped},
        {"renamed.weight" if name == "norm.weight" else name: tensor for name, tensor in TENSORS.items()},
        {**TENSORS, "norm.weight": TENSORS["norm.weight"].double()},
        {**TENSORS, "embed.weight": TENSORS["embed.weight"].reshape(4, 8)},
    ]
    assert all(master_digest(changed) != digest for changed in changes)


def test_digests_of_parts_combine_into_the_digest_of_the_whole_in_any_order():
    parts = [
        tensor_digests({"norm.weight": TENSORS["norm.weight"]}),
        tensor_digests({"embed.weight": TENSORS["embed.weight"]}),
    ]
    assert combined_digest(parts[0] | parts[1]) == master_digest(TENSORS)
    assert combined_digest(parts[1] | parts[0]) == master_digest(TENSORS)
