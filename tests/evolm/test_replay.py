"""The replay buffer of temporal contrast: its age window, eviction, seeded sampling, and a save that a resumed run
continues from exactly (written atomically)."""

import json

import pytest

from trl_es.evolm import replay as replay_module
from trl_es.evolm.pairs import PairStats, temporal_contrast
from trl_es.evolm.replay import ReplayBuffer


def buffer_with(entries, **settings) -> ReplayBuffer:
    buffer = ReplayBuffer(**settings)
    for step, question, answer in entries:
        buffer.add(step, question, answer)
    return buffer


@pytest.mark.parametrize(("age", "in_window"), [(19, False), (20, True), (60, True), (100, True), (101, False)])
def test_replay_window_includes_both_ends_min_age_and_max_age(age, in_window):
    buffer = buffer_with([(200 - age, "q", "old answer")], min_age=20, max_age=100)
    assert buffer.sample("q", step=200) == ("old answer" if in_window else None)


def test_replay_never_pairs_an_answer_with_its_own_checkpoint_when_min_age_is_positive():
    same_step = [(50, "q", "answer at step 50")]
    assert buffer_with(same_step, min_age=1, max_age=100).sample("q", step=50) is None
    assert buffer_with(same_step, min_age=0, max_age=100).sample("q", step=50) == "answer at step 50"
    pairs, stats = temporal_contrast(["q"], ["answer now"], buffer_with(same_step, min_age=1), step=50)
    assert pairs == [] and stats == PairStats(built=0, ties_dropped=0, fallbacks=1)


def test_replay_ignores_answers_from_later_steps_and_other_questions():
    buffer = buffer_with([(60, "q", "from the future"), (0, "other", "another question's answer")], min_age=0)
    assert buffer.sample("q", step=50) is None
    assert buffer.sample("other", step=50) == "another question's answer"


def test_replay_evicts_the_oldest_added_first_past_maxlen():
    buffer = buffer_with([(step, f"q{step}", f"a{step}") for step in range(5)], maxlen=3, min_age=0)
    assert len(buffer) == 3
    assert list(buffer) == [(2, "q2", "a2"), (3, "q3", "a3"), (4, "q4", "a4")]
    assert buffer.sample("q1", step=4) is None
    assert buffer.sample("q2", step=4) == "a2"


def draws(buffer: ReplayBuffer, count: int = 20) -> list[str]:
    return [buffer.sample("q", step=100) for _ in range(count)]


ELEVEN_OLD_ANSWERS = [(step, "q", f"answer at {step}") for step in range(0, 81, 8)]  # ages 100..20, all in window


def test_replay_sampling_is_seeded():
    first = draws(buffer_with(ELEVEN_OLD_ANSWERS, seed=3))
    assert first == draws(buffer_with(ELEVEN_OLD_ANSWERS, seed=3))
    assert first != draws(buffer_with(ELEVEN_OLD_ANSWERS, seed=4))
    assert len(set(first)) > 1  # it does pick among the answers in the window


def test_replay_save_load_continues_as_if_never_interrupted(tmp_path):
    path = tmp_path / "replay_buffer.json"
    uninterrupted = buffer_with(ELEVEN_OLD_ANSWERS, maxlen=50, min_age=20, max_age=100, seed=3)
    draws(uninterrupted, 7)  # the generator has moved on from its seed
    uninterrupted.save(path)
    expected = draws(uninterrupted)

    resumed = ReplayBuffer.load(path)
    assert draws(resumed) == expected
    assert list(resumed) == ELEVEN_OLD_ANSWERS
    assert (resumed.maxlen, resumed.min_age, resumed.max_age, resumed.seed) == (50, 20, 100, 3)
    assert draws(buffer_with(ELEVEN_OLD_ANSWERS, seed=3)) != expected  # re-seeding would not have continued


def test_replay_save_is_json_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "stage" / "replay_buffer.json"  # the folder is created
    buffer = buffer_with([(0, "q", "first")])
    buffer.save(path)
    assert json.loads(path.read_text())["entries"] == [[0, "q", "first"]]

    def crash(*args):
        raise OSError("disk full")

    buffer.add(1, "q", "second")
    monkeypatch.setattr(replay_module.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        buffer.save(path)
    assert list(ReplayBuffer.load(path)) == [(0, "q", "first")]  # the old file is intact
    assert [p.name for p in path.parent.iterdir()] == ["replay_buffer.json"]  # no temporary file left


def test_replay_load_rejects_a_file_that_is_not_a_buffer(tmp_path):
    other = tmp_path / "phase.json"
    other.write_text(json.dumps({"role": "rubric"}))
    with pytest.raises(ValueError, match="not a replay buffer"):
        ReplayBuffer.load(other)
    damaged = tmp_path / "damaged.json"
    buffer_with([(0, "q", "a")]).save(damaged)
    state = json.loads(damaged.read_text())
    del state["rng_state"]
    damaged.write_text(json.dumps(state))
    with pytest.raises(ValueError, match="damaged replay buffer.*delete it"):
        ReplayBuffer.load(damaged)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"maxlen": 0}, r"`maxlen` must be an integer >= 1, got 0\. Keep at least one"),
        ({"min_age": -1}, r"`min_age` must be an integer >= 0, got -1\. Use 0"),
        ({"min_age": 30, "max_age": 10}, r"`max_age` must be an integer >= 30, got 10\. Use max_age >= min_age=30"),
        ({"max_age": 2.5}, r"`max_age` must be an integer >= 20, got 2\.5"),
    ],
)
def test_replay_settings_are_validated(settings, message):
    with pytest.raises(ValueError, match=message):
        ReplayBuffer(**settings)


def test_replay_add_needs_a_policy_step():
    with pytest.raises(ValueError, match=r"`step` must be an integer >= 0, got -1\. Pass the number of policy steps"):
        ReplayBuffer().add(-1, "q", "a")
