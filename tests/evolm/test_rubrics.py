"""The rubric format: which texts parse into a rubric, and what the error says about those that do not."""

import json

import pytest

from trl_es.evolm.rubrics import (
    Criterion,
    Rubric,
    RubricError,
    RubricRules,
    parse_rubric,
    rubric_is_valid,
)

RUBRIC = '{"criteria": [{"criterion": "States 19", "weight": 0.6}, {"criterion": "Shows the sum", "weight": 0.4}]}'
PARSED = Rubric((Criterion("States 19", 0.6), Criterion("Shows the sum", 0.4)))


def _rubric(*criteria) -> str:
    return json.dumps({"criteria": [{"criterion": text, "weight": weight} for text, weight in criteria]})


GOOD = {
    "bare JSON object": RUBRIC,
    "surrounding whitespace": f"\n  {RUBRIC}\n",
    "json fence": f"Here is the rubric:\n```json\n{RUBRIC}\n```\nGood luck.",
    "bare fence": f"```\n{RUBRIC}\n```",
    "prose before and after": f"Sure! {RUBRIC} Hope this helps.",
    "a think block with a JSON object first": f'<think>Draft: {{"criteria": []}}</think>\n{RUBRIC}',
    "a brace in prose before the object": f"For {{question}} I wrote: {RUBRIC}",
    "another JSON object before the rubric": f'An example answer: {{"answer": 19}}. The rubric: {RUBRIC}',
    "extra keys ignored": json.dumps(
        {
            "title": "t",
            "criteria": [
                {"criterion": "States 19", "weight": 0.6, "why": "x"},
                {"criterion": "Shows the sum", "weight": 0.4},
            ],
        }
    ),
    "criterion text stripped": _rubric((" States 19 ", 0.6), ("Shows the sum\n", 0.4)),
}

# Weight sums at the edge of the tolerance, written as decimals (float rounding must not reject them).
EDGE_SUMS = {
    "sum 0.85": _rubric(("a", 0.5), ("b", 0.35)),
    "sum 1.15": _rubric(("a", 0.5), ("b", 0.65)),
    "ten weights of 0.1": _rubric(*[(str(k), 0.1) for k in range(10)]),
}

BAD = [
    ("plain prose", "The answer must state 19.", "not JSON: no JSON object with `criteria`"),
    ("empty", "", "not JSON"),
    ("truncated object", '{"criteria": [{"criterion": "a", "weight": 0.5}', "the first unreadable object: Expecting"),
    ("prose and an object without criteria", 'See {"rubric": []}.', "no JSON object with `criteria`"),
    (
        "a JSON array",
        '[{"criterion": "a", "weight": 1}]',
        "must be a JSON object with a `criteria` list, got a JSON array",
    ),
    ("no criteria key", '{"rubric": []}', "has no `criteria` (its keys: ['rubric'])"),
    ("criteria not a list", '{"criteria": "be right"}', "`criteria` must be a list, got a JSON string"),
    ("no criteria", '{"criteria": []}', "has 0 criteria; at least 2 are required"),
    ("one criterion", _rubric(("a", 1.0)), "has 1 criterion; at least 2 are required"),
    (
        "a criterion that is a string",
        '{"criteria": [{"criterion": "a", "weight": 0.5}, "b"]}',
        "Criterion 2 must be an object",
    ),
    (
        "empty criterion text",
        _rubric(("", 0.5), ("b", 0.5)),
        "Criterion 1 has no text: `criterion` must be a non-empty string, got ''",
    ),
    ("blank criterion text", _rubric(("a", 0.5), ("  ", 0.5)), "Criterion 2 has no text"),
    (
        "no criterion key",
        '{"criteria": [{"weight": 0.5}, {"criterion": "b", "weight": 0.5}]}',
        "Criterion 1 has no text",
    ),
    (
        "numeric criterion text",
        _rubric((19, 0.5), ("b", 0.5)),
        "Criterion 1 has no text: `criterion` must be a non-empty string, got 19",
    ),
    ("zero weight", _rubric(("a", 1.0), ("b", 0)), "Criterion 2 has weight 0; a weight must be > 0"),
    ("negative weight", _rubric(("a", 1.2), ("b", -0.2)), "Criterion 2 has weight -0.2; a weight must be > 0"),
    (
        "weight as text",
        _rubric(("a", "0.5"), ("b", 0.5)),
        "Criterion 1 has weight '0.5'; a weight must be a positive JSON number",
    ),
    ("weight as boolean", _rubric(("a", True), ("b", 0.5)), "Criterion 1 has weight True"),
    (
        "missing weight",
        '{"criteria": [{"criterion": "a"}, {"criterion": "b", "weight": 1}]}',
        "Criterion 1 has weight None",
    ),
    (
        "NaN weight",
        '{"criteria": [{"criterion": "a", "weight": NaN}, {"criterion": "b", "weight": 1}]}',
        "Criterion 1 has weight nan",
    ),
    (
        "weights sum to 0.6",
        _rubric(("a", 0.3), ("b", 0.3)),
        "The weights sum to 0.6, not 1 ± 0.15; make them sum to 1",
    ),
    ("weights sum to 1.2", _rubric(("a", 0.6), ("b", 0.6)), "The weights sum to 1.2, not 1 ± 0.15"),
    ("weights are points", _rubric(("a", 3), ("b", 7)), "The weights sum to 10"),
    ("a fence that is not JSON", "```json\ncriteria: [a, b]\n```", "The fenced block is not JSON"),
    ("only a think block", '<think>{"criteria": []}</think>', "not JSON"),
]


@pytest.mark.parametrize("text", list(GOOD.values()), ids=list(GOOD))
def test_good_rubrics_parse(text):
    assert parse_rubric(text) == PARSED
    assert rubric_is_valid(text)


@pytest.mark.parametrize("text", list(EDGE_SUMS.values()), ids=list(EDGE_SUMS))
def test_weights_at_the_edge_of_the_tolerance_are_valid(text):
    assert rubric_is_valid(text)


@pytest.mark.parametrize(("text", "message"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_rubrics_raise_an_error_that_names_the_problem(text, message):
    with pytest.raises(RubricError) as error:
        parse_rubric(text)
    assert message in str(error.value)
    assert not rubric_is_valid(text)


def test_a_rubric_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse_rubric("{}")


def test_text_that_is_not_a_string_is_an_error():
    with pytest.raises(RubricError, match="must be text, got NoneType"):
        parse_rubric(None)


def test_just_outside_the_tolerance_is_invalid():
    assert not rubric_is_valid(_rubric(("a", 0.5), ("b", 0.34)))
    assert not rubric_is_valid(_rubric(("a", 0.5), ("b", 0.66)))


def test_rules_set_the_number_of_criteria_and_the_tolerance():
    three = _rubric(("a", 0.3), ("b", 0.3), ("c", 0.3))
    assert rubric_is_valid(three, RubricRules(min_criteria=3))
    assert not rubric_is_valid(RUBRIC, RubricRules(min_criteria=3))
    assert not rubric_is_valid(three, RubricRules(weight_tolerance=0.05))
    with pytest.raises(RubricError, match="sum to 0.9, not 1 ± 0.05"):
        parse_rubric(three, RubricRules(weight_tolerance=0.05))
    assert rubric_is_valid(_rubric(("a", 1.0)), RubricRules(min_criteria=1))


def test_the_default_rules_are_the_authors_values():
    assert RubricRules() == RubricRules(min_criteria=2, weight_tolerance=0.15)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"min_criteria": 0}, "`min_criteria` must be an integer >= 1, got 0"),
        ({"min_criteria": 2.5}, "`min_criteria` must be an integer >= 1, got 2.5"),
        ({"weight_tolerance": -0.1}, r"`weight_tolerance` must be in \[0, 1\), got -0.1"),
        ({"weight_tolerance": 1.0}, r"`weight_tolerance` must be in \[0, 1\), got 1.0"),
    ],
)
def test_bad_rules_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        RubricRules(**overrides)


def test_to_json_holds_only_the_validated_criteria_and_parses_back():
    rubric = parse_rubric(GOOD["extra keys ignored"])
    assert json.loads(rubric.to_json()) == {
        "criteria": [{"criterion": "States 19", "weight": 0.6}, {"criterion": "Shows the sum", "weight": 0.4}]
    }
    assert parse_rubric(rubric.to_json()) == rubric


def test_from_dict_checks_like_parse():
    assert Rubric.from_dict(json.loads(RUBRIC)) == PARSED
    with pytest.raises(RubricError, match="has 1 criterion"):
        Rubric.from_dict({"criteria": [{"criterion": "a", "weight": 1.0}]})


def test_rubrics_are_frozen_values():
    with pytest.raises(AttributeError):
        PARSED.criteria = ()
    assert hash(PARSED) == hash(parse_rubric(RUBRIC))
