"""The backend interface (`trl_es.backends.base`): `RowRequest`, and `generate_rows` / `member_loaded` of the backends
that write one member's weights at a time (`OneMemberAtATime`), on the Hugging Face backend: each member loaded once
per call, the centre (or the member a `member_loaded` context keeps) loaded back at the end, also on errors."""

import pytest
import torch
from scripts.ragged_rows import MEMBER_0, MEMBER_1, ragged_rows

from trl_es.backends.base import RowRequest
from trl_es.backends.hf import HFBackend, TokenIds
from trl_es.backends.sampling import SamplingSettings
from trl_es.core.master import MasterWeights
from trl_es.core.noise import Member
from trl_es.testing import build_tiny_qwen2

GREEDY = SamplingSettings(max_tokens=4)


class RecordingBackend(HFBackend):
    """The Hugging Face backend, recording every load: a member, or None for the centre."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loads = []

    def load_member(self, member):
        self.loads.append(member)
        super().load_member(member)

    def load_center(self):
        self.loads.append(None)
        super().load_center()


@pytest.fixture
def backend(tokenizer):
    model = build_tiny_qwen2(tokenizer, initializer_range=0.3).eval()
    parameters = dict(model.named_parameters())
    return RecordingBackend(model, parameters, MasterWeights(parameters, 0.05), TokenIds.of(model, tokenizer))


@pytest.fixture
def rows(tokenizer):
    return ragged_rows(lambda text: tokenizer(text)["input_ids"])


def holds_the_centre(backend) -> bool:
    return all(torch.equal(param, backend.master.tensors[name]) for name, param in backend.parameters.items())


def test_a_row_request_names_a_member_or_the_centre_and_a_prompt():
    assert RowRequest(None, [1, 2], None).member is None
    with pytest.raises(TypeError, match="must be a Member or None"):
        RowRequest(11, [1, 2], 0)
    with pytest.raises(ValueError, match="has no prompt token"):
        RowRequest(Member(11), [], 0)


def test_rows_load_each_member_once_and_the_centre_last(backend, rows):
    backend.generate_rows(rows, GREEDY)
    # The centre's rows first, with the weights in place; then members in the order they first appear.
    assert backend.loads == [MEMBER_0, MEMBER_1, None]
    assert holds_the_centre(backend)
    backend.loads.clear()
    assert backend.generate_rows([row for row in rows if row.member is None], GREEDY) and backend.loads == []
    assert backend.generate_rows([], GREEDY) == [] and backend.loads == []


def test_the_centre_is_loaded_back_when_a_members_rows_fail(backend, rows, tokenizer):
    beyond_the_vocabulary = RowRequest(MEMBER_1, [len(tokenizer) + 1000], 0)
    with pytest.raises(IndexError):
        backend.generate_rows([rows[0], beyond_the_vocabulary], GREEDY)
    assert backend.loads[-1] is None and holds_the_centre(backend)


def test_a_load_that_fails_half_way_is_undone(backend, rows):
    class HalfWritten(RuntimeError):
        pass

    def load_then_fail(member):
        HFBackend.load_member(backend, member)
        raise HalfWritten()

    backend.load_member = load_then_fail
    with pytest.raises(HalfWritten):
        backend.generate_rows(rows, GREEDY)
    assert holds_the_centre(backend)
    with pytest.raises(HalfWritten):
        with backend.member_loaded(MEMBER_0):
            pass
    assert holds_the_centre(backend)


def test_member_loaded_keeps_a_member_in_place_and_changes_no_completion(backend, rows):
    members_rows = [row for row in rows if row.member == MEMBER_0]
    expected = backend.generate_rows(rows, GREEDY)
    backend.loads.clear()
    with backend.member_loaded(MEMBER_0):
        first = backend.generate_rows(members_rows, GREEDY)
        second = backend.generate_rows(members_rows, GREEDY)
        assert backend.loads == [MEMBER_0]  # loaded once, for the whole context
        mixed = backend.generate_rows(rows, GREEDY)  # other members' rows: loaded, then MEMBER_0 put back
        assert backend.loads == [MEMBER_0, None, MEMBER_1, MEMBER_0]
        [[alone]] = backend.generate([MEMBER_1], [rows[2].prompt_ids], GREEDY, None)
        assert backend.loads[-1] == MEMBER_0  # `generate` puts the kept member back too
        assert backend.generate_rows(members_rows, GREEDY) == first and backend.loads[-1] == MEMBER_0
    assert backend.loads[-1] is None and holds_the_centre(backend)
    assert first == second == [expected[index] for index, row in enumerate(rows) if row.member == MEMBER_0]
    assert mixed == expected and alone == expected[2]


def test_member_loaded_loads_the_centre_back_after_an_error(backend, rows):
    with pytest.raises(RuntimeError, match="tool crashed"):
        with backend.member_loaded(MEMBER_0):
            backend.generate_rows(rows[:1], GREEDY)
            raise RuntimeError("tool crashed")
    assert backend.loads == [MEMBER_0, None] and holds_the_centre(backend)


def test_member_loaded_contexts_nest(backend, rows):
    with backend.member_loaded(MEMBER_0):
        with backend.member_loaded(MEMBER_1):
            with backend.member_loaded(MEMBER_1):  # already in place: nothing to load
                backend.generate_rows([rows[2]], GREEDY)
        assert backend.loads == [MEMBER_0, MEMBER_1, MEMBER_0]
    assert backend.loads[-1] is None and holds_the_centre(backend)
