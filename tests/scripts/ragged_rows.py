"""The rows the `generate_rows` tests of every backend ask for (tests/backends/): several members with ragged counts,
interleaved (member 0: 3 rows, member 1: 1, the centre: 2), prompts of different lengths; and what each member
generates alone through the single-member path (`generate` for one member, `generate_center` for the centre)."""

from trl_es.backends.base import RowRequest, rows_by_member
from trl_es.core.noise import Member

MEMBER_0, MEMBER_1 = Member(seed=11, sign=1), Member(seed=12, sign=-1)
# (member, prompt text), in the order of the call; each member's `j`-th row samples with `seed + j`, as `generate`
# seeds row `j`, so the rows of different members share seeds (common random numbers).
LAYOUT = [
    (MEMBER_0, "Question: what is"),
    (None, "Item 3:"),
    (MEMBER_1, "The quick brown fox jumps"),
    (MEMBER_0, "Item 1:"),
    (None, "Hello there, my good friend"),
    (MEMBER_0, "a b"),
]


def ragged_rows(tokenize, seed: int | None = 5) -> list[RowRequest]:
    """The rows of `LAYOUT`, `tokenize(text)` giving a prompt's ids."""
    rows, counts = [], {}
    for member, text in LAYOUT:
        position = counts[member] = counts.get(member, -1) + 1
        rows.append(RowRequest(member, tokenize(text), None if seed is None else seed + position))
    return rows


def generated_alone(backend, rows: list[RowRequest], sampling, seed: int | None = 5) -> list[list[int]]:
    """Each row's completion when its member's rows are generated alone, by the single-member path with `seed` (row
    `j` of a member with `seed + j`, as `ragged_rows` seeds them), in the order of `rows`."""
    completions = [None] * len(rows)
    for member, indices in rows_by_member(rows).items():
        prompts = [rows[index].prompt_ids for index in indices]
        if member is None:
            generated = backend.generate_center(prompts, sampling, seed)
        else:
            [generated] = backend.generate([member], prompts, sampling, seed)
        for index, completion in zip(indices, generated, strict=True):
            completions[index] = completion
    return completions
