"""Live rubrics (`EvolmConfig.live_rubrics`): a policy phase's rubrics written at every step by the model being
trained, once per step, instead of the phase start's snapshot."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset, load_from_disk
from scripts.fast_es import fast_es_config
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from trl_es.evolm import EvolmConfig, EvolmTrainer, LiveRubrics
from trl_es.evolm.live_rubrics import with_live_rubrics

QUESTIONS = [f"What is {k} plus {k}?" for k in range(4)]


def live(tiny_model_path, model):
    rubrics = LiveRubrics(AutoTokenizer.from_pretrained(tiny_model_path), "Rubric for: {question}", 1.0, 8, seed=0)
    rubrics.on_train_begin(SimpleNamespace(output_dir="run/stage-0-policy-es"), None, None, model=model)
    return rubrics


def test_a_steps_rubrics_are_written_once_by_the_current_model(tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    rubrics = live(tiny_model_path, model)
    first = rubrics.rubrics_for(QUESTIONS[:2], step=0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    assert rubrics.rubrics_for(QUESTIONS[:2], step=0) == first  # every member of a step reads the same rubrics
    # The next step's are the changed model's: what a fresh writer of that model writes at that step.
    assert rubrics.rubrics_for(QUESTIONS[:2], step=1) == live(tiny_model_path, model).rubrics_for(QUESTIONS[:2], 1)


def test_the_reward_reads_the_live_rubric_of_each_rows_question(tiny_model_path):
    rubrics = live(tiny_model_path, AutoModelForCausalLM.from_pretrained(tiny_model_path))
    seen = {}

    def policy_reward(prompts, completions, rubric, **kwargs):
        seen["rubric"] = rubric
        return [0.0] * len(completions)

    reward = with_live_rubrics(policy_reward, rubrics)
    questions = [QUESTIONS[1], QUESTIONS[0], QUESTIONS[1]]
    reward(["p"] * 3, ["c"] * 3, trainer_state=SimpleNamespace(global_step=3), question=questions)
    assert seen["rubric"] == rubrics.rubrics_for(questions, step=3) and seen["rubric"][0] == seen["rubric"][2]
    assert reward.__name__ == "policy_reward"


def test_live_rubrics_outside_a_phase_are_refused(tiny_model_path):
    rubrics = LiveRubrics(AutoTokenizer.from_pretrained(tiny_model_path), "{question}", 1.0, 8, seed=0)
    with pytest.raises(RuntimeError, match="outside a training phase"):
        rubrics.rubrics_for(QUESTIONS, step=0)


def test_a_static_schedule_cannot_read_live_rubrics(tmp_path):
    args = fast_es_config(tmp_path / "unused", max_steps=1)
    with pytest.raises(ValueError, match="live_rubrics=True writes rubrics with the model being trained"):
        EvolmConfig(str(tmp_path), policy_args=args, rubric_args=args, schedule="static", live_rubrics=True)


class Logs(TrainerCallback):
    def __init__(self):
        self.seen = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen.append({"phase": Path(args.output_dir).name, **(logs or {})})


class LengthJudge:
    async def score(self, question, rubric, response):
        return min(len(response), 20) / 20


@pytest.mark.slow
def test_a_policy_phase_trains_on_live_rubrics(tmp_path, tiny_model_path):
    args = EvolmConfig(
        str(tmp_path / "evolm"),
        policy_args=fast_es_config(tmp_path / "unused", max_steps=2),
        rubric_args=fast_es_config(tmp_path / "unused", max_steps=1),
        rounds=1,
        replay_min_age=0,
        live_rubrics=True,
    )
    logs = Logs()
    dataset = Dataset.from_dict({"question": QUESTIONS})
    EvolmTrainer(tiny_model_path, LengthJudge(), args, dataset, callbacks=[logs]).train()
    policy = Path(args.output_dir) / "stage-0-policy-es"
    assert load_from_disk(str(policy / "dataset")).column_names == ["prompt", "question"]  # no snapshot to read
    assert [entry for entry in logs.seen if entry["phase"] == policy.name and "policy/rubric_valid_rate" in entry]
