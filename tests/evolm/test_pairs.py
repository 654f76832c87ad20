"""Preference pairs of EVOLM: the replay buffer, the three sources and their mixture, with a fake `generate`."""

import warnings
from collections import Counter

import pytest

from trl_es.evolm.pairs import (
    SOURCES,
    Pair,
    PairMixture,
    PairStats,
    ReplayBuffer,
    check_pair_sources,
    inferred_question,
    rubric_conditioned,
    temporal_contrast,
)
from trl_es.evolm.prompts import Prompts, render

PROMPTS = Prompts()


class FakeGenerate:
    """The trainer's generation path, faked: one completion per prompt, derived from the prompt; records each call."""

    def __init__(self, respond=lambda prompt: f"completion of <{prompt}>"):
        self.respond = respond
        self.calls: list[list[str]] = []

    def __call__(self, prompts: list[str]) -> list[str]:
        self.calls.append(list(prompts))
        return [self.respond(prompt) for prompt in prompts]


def completion(prompt: str) -> str:
    return f"completion of <{prompt}>"


def buffer_with(entries, **settings) -> ReplayBuffer:
    buffer = ReplayBuffer(**settings)
    for step, question, answer in entries:
        buffer.add(step, question, answer)
    return buffer


# ----------------------------------------------------------------------------------------------------------------
# Temporal contrast


def test_temporal_contrast_pairs_the_current_answer_with_an_older_one_to_the_same_question():
    buffer = buffer_with([(0, "q1", "old 1"), (0, "q2", "old 2"), (45, "q1", "too recent")])
    pairs, stats = temporal_contrast(["q1", "q2", "q3"], ["new 1", "new 2", "new 3"], buffer, step=50)
    assert pairs == [Pair("q1", "new 1", "old 1", "temporal"), Pair("q2", "new 2", "old 2", "temporal")]
    assert stats == PairStats(built=2, ties_dropped=0, fallbacks=1)  # q3: nothing old enough, skipped


def test_temporal_contrast_drops_and_counts_ties_up_to_whitespace():
    buffer = buffer_with([(0, "q1", "the  answer\n"), (0, "q2", "old")])
    pairs, stats = temporal_contrast(["q1", "q2"], [" the answer", "new"], buffer, step=50)
    assert pairs == [Pair("q2", "new", "old", "temporal")]
    assert stats == PairStats(built=1, ties_dropped=1, fallbacks=0)


# ----------------------------------------------------------------------------------------------------------------
# Inferred question


def test_inferred_question_answers_the_question_inferred_from_the_answer():
    generate = FakeGenerate()
    pairs, stats = inferred_question(["q1", "q2"], ["answer 1", "answer 2"], generate)
    inference_prompts = [render(PROMPTS.infer_question, response=a) for a in ("answer 1", "answer 2")]
    inferred = [completion(prompt) for prompt in inference_prompts]
    answer_prompts = [render(PROMPTS.policy, question=question) for question in inferred]
    assert generate.calls == [inference_prompts, answer_prompts]  # one batched call per round, not per question
    assert pairs == [
        Pair("q1", "answer 1", completion(answer_prompts[0]), "inferred"),
        Pair("q2", "answer 2", completion(answer_prompts[1]), "inferred"),
    ]
    assert stats == PairStats(built=2)


def test_inferred_question_infers_with_its_own_generate_when_given_one():
    generate, infer = FakeGenerate(), FakeGenerate()
    inferred_question(["q1"], ["answer 1"], generate, infer=infer)
    inference_prompt = render(PROMPTS.infer_question, response="answer 1")
    assert infer.calls == [[inference_prompt]]
    assert generate.calls == [[render(PROMPTS.policy, question=completion(inference_prompt))]]


def test_inferred_question_sees_the_answer_without_its_reasoning():
    generate = FakeGenerate(lambda prompt: "<think>hmm</think> What is 6 times 7?")
    inferred_question(["What is 6*7?"], ["<think>The question asks 6*7.</think>\n42"], generate)
    assert generate.calls[0] == [render(PROMPTS.infer_question, response="42")]
    assert generate.calls[1] == [render(PROMPTS.policy, question="What is 6 times 7?")]


def test_inferred_question_drops_and_counts_ties():
    generate = FakeGenerate(lambda prompt: "  same\nanswer ")
    pairs, stats = inferred_question(["q1", "q2"], ["same answer", "other answer"], generate)
    assert [pair.question for pair in pairs] == ["q2"]
    assert stats == PairStats(built=1, ties_dropped=1, fallbacks=0)


def test_inferred_question_uses_the_given_templates():
    generate = FakeGenerate(lambda prompt: "inferred")
    custom = Prompts(policy="Q: {question}\nA:", infer_question="Which question does this answer? {response}")
    inferred_question(["q"], ["a"], generate, prompts=custom)
    assert generate.calls == [["Which question does this answer? a"], ["Q: inferred\nA:"]]


# ----------------------------------------------------------------------------------------------------------------
# Rubric-conditioned


def test_rubric_conditioned_answers_with_and_without_the_rubric_in_one_call():
    generate = FakeGenerate()
    rubrics = ['{"criteria": [{"criterion": "r1", "weight": 1}]}', '{"criteria": [{"criterion": "r2", "weight": 1}]}']
    pairs, stats = rubric_conditioned(["q1", "q2"], rubrics, generate)
    with_rubric = [
        render(PROMPTS.policy_with_rubric, question=q, rubric=r) for q, r in zip(["q1", "q2"], rubrics, strict=True)
    ]
    without_rubric = [render(PROMPTS.policy, question=q) for q in ["q1", "q2"]]
    assert generate.calls == [with_rubric + without_rubric]
    assert pairs == [
        Pair("q1", completion(with_rubric[0]), completion(without_rubric[0]), "rubric_conditioned"),
        Pair("q2", completion(with_rubric[1]), completion(without_rubric[1]), "rubric_conditioned"),
    ]
    assert stats == PairStats(built=2)


def test_rubric_conditioned_drops_and_counts_ties():
    generate = FakeGenerate(lambda prompt: "same answer" if "r1" in prompt or prompt == "q1" else prompt)
    pairs, stats = rubric_conditioned(["q1", "q2"], ["r1", "r2"], generate)
    assert [pair.question for pair in pairs] == ["q2"]
    assert stats == PairStats(built=1, ties_dropped=1, fallbacks=0)


# ----------------------------------------------------------------------------------------------------------------
# Generation contract


def test_a_source_with_no_question_does_not_call_generate():
    generate = FakeGenerate()
    assert inferred_question([], [], generate) == ([], PairStats())
    assert rubric_conditioned([], [], generate) == ([], PairStats())
    assert generate.calls == []


def test_generate_must_return_one_completion_per_prompt():
    with pytest.raises(ValueError, match="returned 1 completions for 2 prompts; it must return exactly one"):
        rubric_conditioned(["q"], ["r"], lambda prompts: ["only one"])


def test_builders_need_one_entry_per_question():
    with pytest.raises(ValueError, match=r"lengths \{'questions': 2, 'answers': 1\}"):
        temporal_contrast(["q1", "q2"], ["a1"], ReplayBuffer(), step=50)


# ----------------------------------------------------------------------------------------------------------------
# Mixture


def test_mixture_assigns_exactly_the_weights_shares():
    mixture = PairMixture({"temporal": 1, "inferred": 1, "rubric_conditioned": 2})
    assert Counter(mixture.assign(100, seed=0)) == {"temporal": 25, "inferred": 25, "rubric_conditioned": 50}
    # 3 by 1:3:6 is 0.3, 0.9, 1.8: the largest remainders (0.9, 0.8) get the two left after the floors
    assert Counter(PairMixture({"temporal": 1, "inferred": 3, "rubric_conditioned": 6}).assign(3, seed=0)) == {
        "inferred": 1,
        "rubric_conditioned": 2,
    }
    # 10 in thirds: the largest remainders are equal, broken in the order of SOURCES
    assert Counter(PairMixture().assign(10, seed=0)) == {"temporal": 4, "inferred": 3, "rubric_conditioned": 3}


def test_mixture_assignment_is_seeded():
    mixture = PairMixture()
    assert mixture.assign(30, seed=1) == mixture.assign(30, seed=1)
    assert mixture.assign(30, seed=1) != mixture.assign(30, seed=2)


def test_mixture_calls_generate_once_per_source_and_round_with_that_sources_questions():
    questions = [f"q{i}" for i in range(12)]
    answers = [f"a{i}" for i in range(12)]
    rubrics = [f"r{i}" for i in range(12)]
    buffer = buffer_with([(0, q, f"old {q}") for q in questions])
    generate = FakeGenerate()
    mixture = PairMixture()
    pairs, stats = mixture.build(questions, answers, rubrics, generate, buffer, step=50, seed=7)

    assigned = dict(zip(questions, mixture.assign(12, seed=7), strict=True))
    by_source = {source: {q for q in questions if assigned[q] == source} for source in SOURCES}
    assert {source: {p.question for p in pairs if p.source == source} for source in SOURCES} == by_source
    assert all(len(group) == 4 for group in by_source.values())

    inferred = [a for q, a in zip(questions, answers, strict=True) if assigned[q] == "inferred"]
    conditioned = [(q, r) for q, r in zip(questions, rubrics, strict=True) if assigned[q] == "rubric_conditioned"]
    assert len(generate.calls) == 3  # inferred: infer, then answer; rubric-conditioned: both prompts in one call
    assert generate.calls[0] == [render(PROMPTS.infer_question, response=a) for a in inferred]
    assert generate.calls[2] == [render(PROMPTS.policy_with_rubric, question=q, rubric=r) for q, r in conditioned] + [
        render(PROMPTS.policy, question=q) for q, _ in conditioned
    ]
    assert [p.rejected for p in pairs if p.source == "temporal"] == [
        f"old {q}" for q in questions if assigned[q] == "temporal"
    ]
    assert stats == {source: PairStats(built=4) for source in SOURCES}


def test_mixture_skips_a_source_of_weight_zero():
    generate = FakeGenerate()
    mixture = PairMixture({"temporal": 0, "inferred": 0, "rubric_conditioned": 1})
    pairs, stats = mixture.build(["q1", "q2"], ["a1", "a2"], ["r1", "r2"], generate, ReplayBuffer(), step=0, seed=0)
    assert {pair.source for pair in pairs} == {"rubric_conditioned"}
    assert len(generate.calls) == 1
    assert stats["temporal"] == stats["inferred"] == PairStats()


def test_mixture_counts_temporal_questions_without_an_older_answer_as_fallbacks():
    mixture = PairMixture({"temporal": 1})
    pairs, stats = mixture.build(["q1", "q2"], ["a1", "a2"], ["r1", "r2"], FakeGenerate(), ReplayBuffer(), 0, 0)
    assert pairs == []
    assert stats["temporal"] == PairStats(built=0, ties_dropped=0, fallbacks=2)


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ({"temporal": 1, "replay_buffer": 1}, r"Unknown pair source\(s\) \['replay_buffer'\].*the sources are"),
        ({"inferred": -1.0}, r"weight of pair source 'inferred' must be a finite number >= 0, got -1\.0"),
        ({"inferred": float("nan")}, r"'inferred' must be a finite number >= 0, got nan"),
        ({"temporal": 0, "inferred": 0}, r"sum to 0; give at least one source a positive weight"),
        ([("temporal", 1.0)], r"must be a dict of source to weight"),
    ],
)
def test_mixture_weights_are_validated(weights, message):
    with pytest.raises(ValueError, match=message):
        PairMixture(weights)
    with pytest.raises(ValueError, match=message):
        check_pair_sources(weights, schedule_needs_pairs_before_any_policy_step=False)


# ----------------------------------------------------------------------------------------------------------------
# Configuration check


def test_temporal_contrast_alone_is_refused_before_any_policy_step():
    with pytest.raises(ValueError, match="replay buffer has no older answer.*'inferred'.*policy phase first"):
        check_pair_sources({"temporal": 1.0}, schedule_needs_pairs_before_any_policy_step=True)
    with pytest.raises(ValueError, match="only pair source"):
        check_pair_sources({"temporal": 1.0, "inferred": 0.0}, schedule_needs_pairs_before_any_policy_step=True)


def test_temporal_contrast_alone_is_accepted_after_a_policy_phase():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_pair_sources({"temporal": 1.0}, schedule_needs_pairs_before_any_policy_step=False)
        check_pair_sources({"inferred": 1.0}, schedule_needs_pairs_before_any_policy_step=True)


def test_temporal_contrast_among_other_sources_warns_before_any_policy_step():
    with pytest.warns(UserWarning, match="temporal contrast finds no older answer"):
        check_pair_sources({"temporal": 1.0, "inferred": 1.0}, schedule_needs_pairs_before_any_policy_step=True)
