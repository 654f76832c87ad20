"""EVOLM's rewards: the policy's judge score, the rubric's discriminative reward and the format reward, called as TRL
calls them, and one training step of each role under GRPOTrainer and ESTrainer."""

import json
import math

import pytest
from datasets import Dataset
from scripts.fast_es import fast_es_config, fast_grpo_config
from trl import GRPOTrainer

from trl_es import ESTrainer
from trl_es.evolm import rewards
from trl_es.evolm.rewards import format_reward, policy_reward, rubric_reward
from trl_es.evolm.rubrics import RubricRules, parse_rubric

FAIL = "<judge fails>"


def _rubric(*criteria) -> str:
    return json.dumps({"criteria": [{"criterion": text, "weight": weight} for text, weight in criteria]})


# Under RUBRIC a response scores 0.75 for containing "19" and 0.25 for containing "because".
RUBRIC = _rubric(("19", 0.75), ("because", 0.25))
INVALID = "A good answer says 19."


class KeywordJudge:
    """Scores a response by the weight of the rubric's criteria whose text it contains, over the total weight; fails
    (`None`) on a response containing FAIL. Records every call."""

    def __init__(self):
        self.calls = []

    async def score(self, question: str, rubric: str, response: str) -> float | None:
        self.calls.append((question, rubric, response))
        if FAIL in response:
            return None
        criteria = json.loads(rubric)["criteria"]
        met = sum(c["weight"] for c in criteria if c["criterion"] in response)
        return met / sum(c["weight"] for c in criteria)


class LengthJudge:
    """Scores a response by its length (a known function of the completion, for training runs). Records every call."""

    def __init__(self):
        self.calls = []

    @staticmethod
    def value(response: str) -> float:
        return min(len(response), 40) / 40

    async def score(self, question: str, rubric: str, response: str) -> float | None:
        self.calls.append((question, rubric, response))
        return self.value(response)


class ConstantJudge:
    def __init__(self, value):
        self.value = value

    async def score(self, question, rubric, response):
        return self.value


def _call(reward, completions, **columns):
    """Call `reward` as TRL does; returns its rewards and what it logged (each metric at most once per call)."""
    logged = {}

    def log_metric(name, value):
        assert name not in logged, f"{name} logged twice in one call"
        logged[name] = value

    values = reward(
        prompts=["prompt"] * len(completions),
        completions=completions,
        completion_ids=[[0]] * len(completions),
        trainer_state=None,
        log_extra=lambda column, values: None,
        log_metric=log_metric,
        **columns,
    )
    return values, logged


# ---------------------------------------------------------------------------------------------------------------------
# The policy reward


def test_policy_reward_is_the_judge_score_under_the_rows_rubric():
    completions = ["19 because 12 + 7 = 19", "it is 19", "20", "because"]
    values, logged = _call(
        policy_reward(KeywordJudge()), completions, question=["What is 12 + 7?"] * 4, rubric=[RUBRIC] * 4
    )
    assert values == [1.0, 0.75, 0.0, 0.25]
    assert logged == {"policy/rubric_valid_rate": 1.0, "judge/failure_rate": 0.0}


def test_policy_judge_reads_the_rows_question_and_the_parsed_rubric():
    judge = KeywordJudge()
    fenced = f"Rubric:\n```json\n{RUBRIC}\n```"
    _call(policy_reward(judge), ["19", "20"], question=["Q1", "Q2"], rubric=[RUBRIC, fenced])
    canonical = parse_rubric(RUBRIC).to_json()
    assert judge.calls == [("Q1", canonical, "19"), ("Q2", canonical, "20")]


def test_an_invalid_rubric_in_the_column_scores_zero_without_a_judge_call():
    judge = KeywordJudge()
    one_criterion = _rubric(("19", 1.0))
    values, logged = _call(
        policy_reward(judge), ["19 because"] * 3, question=["Q1", "Q2", "Q3"], rubric=[RUBRIC, INVALID, one_criterion]
    )
    assert values == [1.0, 0.0, 0.0]
    assert [question for question, _, _ in judge.calls] == ["Q1"]
    assert logged["policy/rubric_valid_rate"] == pytest.approx(1 / 3)


def test_policy_reward_is_none_only_where_the_judge_failed():
    values, logged = _call(
        policy_reward(KeywordJudge()),
        ["19 because", f"19 {FAIL}", "20", "x"],
        question=["Q"] * 4,
        rubric=[RUBRIC, RUBRIC, RUBRIC, INVALID],
    )
    assert values == [1.0, None, 0.0, 0.0]
    assert logged["judge/failure_rate"] == pytest.approx(1 / 3)  # 1 of the 3 judged rows


def test_policy_reward_reads_conversational_completions():
    completions = [[{"role": "assistant", "content": "19 because"}], [{"role": "assistant", "content": "20"}]]
    values, _ = _call(policy_reward(KeywordJudge()), completions, question=["Q"] * 2, rubric=[RUBRIC] * 2)
    assert values == [1.0, 0.0]


def test_policy_reward_uses_the_given_columns_and_rules():
    reward = policy_reward(KeywordJudge(), question_column="task", rubric_column="criteria")
    values, _ = _call(reward, ["19"], task=["Q"], criteria=[RUBRIC])
    assert values == [0.75]
    strict = policy_reward(KeywordJudge(), rules=RubricRules(min_criteria=3))
    values, logged = _call(strict, ["19"], question=["Q"], rubric=[RUBRIC])
    assert values == [0.0] and logged["policy/rubric_valid_rate"] == 0.0


def test_a_missing_column_names_the_column_and_the_argument():
    with pytest.raises(
        ValueError, match=r"policy_reward reads the dataset column 'rubric'.*\['question'\].*rubric_column="
    ):
        _call(policy_reward(KeywordJudge()), ["19"], question=["Q"])


def test_a_judge_score_outside_zero_one_is_an_error():
    with pytest.raises(
        ValueError, match=r"ConstantJudge returned the score 1.5; a judge must return a score in \[0, 1\]"
    ):
        _call(policy_reward(ConstantJudge(1.5)), ["19"], question=["Q"], rubric=[RUBRIC])


def test_rewards_work_without_log_metric():
    reward = policy_reward(KeywordJudge())
    assert reward(prompts=["p"], completions=["19"], question=["Q"], rubric=[RUBRIC]) == [0.75]


# ---------------------------------------------------------------------------------------------------------------------
# The rubric reward

# Rows of (completion = the rubric, chosen, rejected); J+ and J- under RUBRIC by KeywordJudge.
PAIRS = [
    (RUBRIC, "19 because", "because"),  # J+ = 1, J- = 0.25: margin 0.75
    (RUBRIC, "because", "because so"),  # a tie at 0.25: margin 0
    (RUBRIC, "because", "19"),  # J+ = 0.25, J- = 0.75: margin -0.5
    (INVALID, "19 because", "because"),  # not a rubric: not judged
    (RUBRIC, f"19 {FAIL}", "because"),  # the judge fails on the chosen answer
]
EXPECTED = {
    ("indicator", 1.0): [1.0, 0.0, 0.0, 0.0, None],
    ("margin", 1.0): [0.75, 0.0, -0.5, -1.0, None],
    # log sigma(x) = -log(1 + e^-x) at x = 0.75, 0, -0.5 and, for the invalid rubric, -1.
    ("log_sigmoid", 1.0): [-0.386871, -0.693147, -0.974077, -1.313262, None],
    # The same at x = 4 * (0.75, 0, -0.5, -1).
    ("log_sigmoid", 4.0): [-0.048587, -0.693147, -2.126928, -4.018150, None],
}


def _pair_columns(pairs):
    return {
        "question": [f"Q{row}" for row in range(len(pairs))],
        "chosen": [chosen for _, chosen, _ in pairs],
        "rejected": [rejected for _, _, rejected in pairs],
    }


@pytest.mark.parametrize(("mode", "margin_scale"), list(EXPECTED), ids=[f"{m}-{s:g}" for m, s in EXPECTED])
def test_rubric_reward_values_by_mode(mode, margin_scale):
    reward = rubric_reward(KeywordJudge(), mode=mode, margin_scale=margin_scale)
    values, logged = _call(reward, [rubric for rubric, _, _ in PAIRS], **_pair_columns(PAIRS))
    assert values == pytest.approx(EXPECTED[mode, margin_scale], abs=1e-6)
    assert logged == pytest.approx(
        {
            "rubric/valid_rate": 4 / 5,
            "rubric/mean_margin": (0.75 + 0.0 - 0.5) / 3,  # over the three pairs the judge scored
            "judge/failure_rate": 1 / 8,  # two calls for each of the four valid rubrics, one failed
        }
    )


def test_the_default_mode_is_the_indicator():
    values, _ = _call(rubric_reward(KeywordJudge()), [rubric for rubric, _, _ in PAIRS], **_pair_columns(PAIRS))
    assert values == EXPECTED["indicator", 1.0]


def test_an_invalid_rubric_scores_below_every_valid_one_in_every_mode():
    for mode in ("indicator", "margin", "log_sigmoid"):
        reward = rubric_reward(KeywordJudge(), mode=mode)
        values, _ = _call(reward, [INVALID, RUBRIC], question=["Q"] * 2, chosen=["because"] * 2, rejected=["19"] * 2)
        assert values[0] <= values[1], mode


def test_an_invalid_rubric_scores_the_invalid_score_given():
    reward = rubric_reward(KeywordJudge(), mode="margin", invalid_score=-0.25)
    values, _ = _call(reward, [INVALID, RUBRIC], question=["Q"] * 2, chosen=["because"] * 2, rejected=["19"] * 2)
    assert values[0] == -0.25 and values[1] != -0.25


def test_a_failure_on_the_rejected_answer_is_none_too():
    reward = rubric_reward(KeywordJudge(), mode="margin")
    values, logged = _call(reward, [RUBRIC], question=["Q"], chosen=["19"], rejected=[FAIL])
    assert values == [None]
    assert logged["judge/failure_rate"] == 0.5 and "rubric/mean_margin" not in logged


def test_the_judge_reads_the_parsed_rubric_with_the_rows_question_chosen_and_rejected():
    judge = KeywordJudge()
    completion = [{"role": "assistant", "content": f"Here you go:\n```json\n{RUBRIC}\n```"}]
    _call(rubric_reward(judge), [completion, INVALID], question=["Q1", "Q2"], chosen=["a", "c"], rejected=["b", "d"])
    canonical = parse_rubric(RUBRIC).to_json()
    assert sorted(judge.calls) == [("Q1", canonical, "a"), ("Q1", canonical, "b")]


def test_rubric_reward_uses_the_given_columns_and_rules():
    reward = rubric_reward(KeywordJudge(), question_column="q", chosen_column="good", rejected_column="bad")
    values, _ = _call(reward, [RUBRIC], q=["Q"], good=["19"], bad=["20"])
    assert values == [1.0]
    strict = rubric_reward(KeywordJudge(), rules=RubricRules(min_criteria=3))
    values, logged = _call(strict, [RUBRIC], question=["Q"], chosen=["19"], rejected=["20"])
    assert values == [0.0] and logged == {"rubric/valid_rate": 0.0}


def test_without_a_valid_rubric_no_judge_call_and_no_judge_metrics():
    judge = KeywordJudge()
    values, logged = _call(
        rubric_reward(judge, mode="margin"), [INVALID, ""], question=["Q"] * 2, chosen=["a"] * 2, rejected=["b"] * 2
    )
    assert values == [-1.0, -1.0]
    assert judge.calls == [] and logged == {"rubric/valid_rate": 0.0}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"mode": "pairwise"}, r"`mode` must be one of \('indicator', 'margin', 'log_sigmoid'\), got 'pairwise'"),
        ({"mode": "log_sigmoid", "margin_scale": 0.0}, "`margin_scale` must be > 0, got 0.0"),
        ({"mode": "margin", "margin_scale": 5.0}, "`margin_scale=5.0` only applies to `mode='log_sigmoid'`"),
    ],
)
def test_bad_rubric_reward_arguments_are_rejected(arguments, message):
    with pytest.raises(ValueError, match=message):
        rubric_reward(KeywordJudge(), **arguments)


# ---------------------------------------------------------------------------------------------------------------------
# The format reward, names, and one batch per call


def test_format_reward_is_one_for_a_valid_rubric():
    completions = [RUBRIC, INVALID, [{"role": "assistant", "content": f"```json\n{RUBRIC}\n```"}], _rubric(("a", 1))]
    assert format_reward()(prompts=["p"] * 4, completions=completions) == [1.0, 0.0, 1.0, 0.0]
    assert format_reward(RubricRules(min_criteria=1))(prompts=["p"], completions=[_rubric(("a", 1))]) == [1.0]


def test_reward_functions_are_named_for_their_metrics():
    judge = KeywordJudge()
    assert policy_reward(judge).__name__ == "policy_reward"
    assert rubric_reward(judge, mode="margin").__name__ == "rubric_reward"
    assert format_reward().__name__ == "format_reward"


@pytest.mark.parametrize("role", ["policy", "rubric"])
def test_every_judge_call_of_a_reward_call_goes_in_one_batch(monkeypatch, role):
    batches = []
    score_all = rewards.score_all

    def counting(judge, items):
        batches.append(len(items))
        return score_all(judge, items)

    monkeypatch.setattr(rewards, "score_all", counting)
    if role == "policy":
        _call(policy_reward(KeywordJudge()), ["19"] * 5, question=["Q"] * 5, rubric=[RUBRIC] * 5)
        assert batches == [5]
    else:
        _call(rubric_reward(KeywordJudge()), [r for r, _, _ in PAIRS], **_pair_columns(PAIRS))
        assert batches == [8]


# ---------------------------------------------------------------------------------------------------------------------
# One training step of each role under GRPOTrainer and ESTrainer

NUM_PROMPTS = 8


def _row_rubric(k: int) -> str:
    return _rubric((f"item {k}", 0.5), ("because", 0.5))


def _policy_dataset() -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [f"Item {k}:" for k in range(NUM_PROMPTS)],
            "question": [f"Q{k}" for k in range(NUM_PROMPTS)],
            "rubric": [_row_rubric(k) for k in range(NUM_PROMPTS)],
        }
    )


def _rubric_dataset() -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [f"Write a rubric for item {k}:" for k in range(NUM_PROMPTS)],
            "question": [f"Q{k}" for k in range(NUM_PROMPTS)],
            "chosen": ["19 because"] * NUM_PROMPTS,
            "rejected": ["20"] * NUM_PROMPTS,
        }
    )


def _train(trainer_name, model_path, output_dir, reward_funcs, dataset):
    if trainer_name == "grpo":
        args = fast_grpo_config(output_dir, max_steps=1)
        trainer = GRPOTrainer(model=model_path, reward_funcs=reward_funcs, args=args, train_dataset=dataset)
        completions_per_step = args.per_device_train_batch_size
    else:
        args = fast_es_config(output_dir, max_steps=1)
        trainer = ESTrainer(model=model_path, reward_funcs=reward_funcs, args=args, train_dataset=dataset)
        completions_per_step = args.population_size * args.per_device_train_batch_size
    trainer.train()
    assert trainer.state.global_step == 1
    return trainer.state.log_history[0], completions_per_step


@pytest.mark.parametrize("trainer_name", ["grpo", "es"])
def test_one_policy_step(trainer_name, tiny_model_path, tmp_path):
    judge = LengthJudge()
    logged, completions = _train(trainer_name, tiny_model_path, tmp_path, [policy_reward(judge)], _policy_dataset())
    assert len(judge.calls) == completions  # every row's rubric is valid: one call per completion
    for question, rubric, _ in judge.calls:  # each row's question came with the same row's rubric
        assert rubric == parse_rubric(_row_rubric(int(question[1:]))).to_json()
    expected = sum(judge.value(response) for _, _, response in judge.calls) / completions
    assert logged["rewards/policy_reward/mean"] == pytest.approx(expected, rel=1e-5)
    assert logged["policy/rubric_valid_rate"] == 1.0
    assert logged["judge/failure_rate"] == 0.0


@pytest.mark.parametrize(
    ("trainer_name", "mode", "margin_scale", "invalid_reward"),
    [("grpo", "log_sigmoid", 2.0, -2.126928), ("es", "margin", 1.0, -1.0)],  # log sigma(-2); the lowest margin
)
def test_one_rubric_step(trainer_name, mode, margin_scale, invalid_reward, tiny_model_path, tmp_path):
    # A random tiny model writes no valid rubric in six tokens: every completion scores the invalid floor, unjudged.
    judge = KeywordJudge()
    reward_funcs = [rubric_reward(judge, mode=mode, margin_scale=margin_scale), format_reward()]
    logged, _ = _train(trainer_name, tiny_model_path, tmp_path, reward_funcs, _rubric_dataset())
    assert logged["rewards/rubric_reward/mean"] == pytest.approx(invalid_reward, abs=1e-5)
    assert logged["rewards/format_reward/mean"] == 0.0
    assert logged["rubric/valid_rate"] == 0.0
    assert judge.calls == [] and "judge/failure_rate" not in logged and "rubric/mean_margin" not in logged
    assert not math.isnan(logged["reward"])
