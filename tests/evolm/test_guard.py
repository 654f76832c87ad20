"""The reward-hacking guard: a verified probe that stops an EVOLM phase, or rolls it back, when the judge's reward
rises while the probe's accuracy falls; on its own, and wired into a real ES phase."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from scripts.fast_es import fast_es_config
from transformers import AutoModelForCausalLM, TrainerControl

from trl_es.demo.evolm.settings import DEMO_MODELS
from trl_es.demo.evolm.toy import DEMO_PROMPTS, DEMO_RULES, question_dataset
from trl_es.evolm.config import EvolmConfig
from trl_es.evolm.diagnostics import EvalVerifier
from trl_es.evolm.guard import GUARD_FILE, RewardHackingError, RewardHackingGuard
from trl_es.evolm.trainer import EvolmTrainer


def run_guard(guard, tmp_path, model, rewards):
    """Begin a phase, then end a step after each logged reward; returns the control of the last step."""
    args = SimpleNamespace(output_dir=str(tmp_path))
    state = SimpleNamespace(global_step=0, log_history=[])
    control = TrainerControl()
    guard.on_train_begin(args, state, control, model=model)
    for reward in rewards:
        state.global_step += 1
        state.log_history.append({"reward": reward, "step": state.global_step})
        guard.on_step_end(args, state, control, model=model)
    return control


def test_the_guard_stops_a_phase_whose_reward_rises_while_the_probe_falls(tmp_path, tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    accuracies = iter([0.8, 0.8, 0.7, 0.6])
    guard = RewardHackingGuard(lambda model: next(accuracies), every=1, accuracy_drop=0.15)
    with pytest.raises(RewardHackingError, match=r"rose from 0\.1000 to 0\.5000 .* fell from 0\.8000 to 0\.6000"):
        run_guard(guard, tmp_path, model, [0.1, 0.3, 0.5])
    report = json.loads((tmp_path / GUARD_FILE).read_text())
    assert report["action"] == "stop" and [probe["accuracy"] for probe in report["probes"]] == [0.8, 0.8, 0.7, 0.6]


def test_the_guard_lets_a_phase_be_whose_reward_or_probe_does_not_say_gamed(tmp_path, tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    accuracies = iter([0.8, 0.5, 0.4, 0.8, 0.8, 0.75])
    falling = RewardHackingGuard(lambda model: next(accuracies), every=1, accuracy_drop=0.1)
    assert not run_guard(falling, tmp_path, model, [0.5, 0.4]).should_training_stop  # the reward fell too
    steady = RewardHackingGuard(lambda model: next(accuracies), every=1, accuracy_drop=0.1)
    assert not run_guard(steady, tmp_path, model, [0.1, 0.9]).should_training_stop  # within accuracy_drop
    assert not (tmp_path / GUARD_FILE).exists()


def test_a_rollback_guard_puts_the_phase_start_weights_back_and_ends_the_phase(tmp_path, tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    accuracies = iter([0.9, 0.2])

    def probe(model):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1.0)  # what the phase did to the weights
        return next(accuracies)

    guard = RewardHackingGuard(probe, every=2, accuracy_drop=0.1, action="rollback")
    assert run_guard(guard, tmp_path, model, [0.1, 0.6]).should_training_stop
    assert all(torch.equal(p, start[name]) for name, p in model.named_parameters())
    assert json.loads((tmp_path / GUARD_FILE).read_text())["action"] == "rollback"


def test_an_evolm_phase_whose_judge_is_gamed_stops_with_the_probes_figures(tmp_path):
    """The whole wiring on a real ES policy phase of the demo's joint model (which writes valid rubrics, so the judge
    is asked): the judge's reward rises call after call, and the verified probe (the held-out questions, answered
    greedily by the phase's model) falls, as a gamed judge would make them."""

    class RisingJudge:
        calls = 0

        async def score(self, question, rubric, response):
            RisingJudge.calls += 1
            return min(1.0, RisingJudge.calls / 200)

    def answer_is_correct(question, answer):
        return RisingJudge.calls < 20  # right until the phase has trained on the judge (8 rows x 4 members a step)

    questions = question_dataset("train", 8)
    phase = dict(max_completion_length=32, per_device_train_batch_size=8)
    args = EvolmConfig(
        str(tmp_path / "evolm"),
        policy_args=fast_es_config(tmp_path / "unused", max_steps=4, **phase),
        rubric_args=fast_es_config(tmp_path / "unused", max_steps=1, **phase),
        rounds=1,
        replay_min_age=0,
        prompts=DEMO_PROMPTS,
        rubric_rules=DEMO_RULES,
        verifier=EvalVerifier(answer_is_correct, held_out_questions=("What is 9 plus 9?", "What is 8 plus 8?")),
        guard_steps=2,
        guard_accuracy_drop=0.2,
    )
    with pytest.raises(RewardHackingError, match=r"at step 4: its judge reward rose .* fell from 1\.0000 to 0\.0000"):
        EvolmTrainer(str(DEMO_MODELS["joint"]), RisingJudge(), args, questions).train()
    report = json.loads((Path(args.output_dir) / "stage-0-policy-es" / GUARD_FILE).read_text())
    # Probed at the start and every 2 steps; at step 2 only one reward was logged yet (the step's own is logged
    # after its end), so the guard waited for a second.
    assert [(probe["step"], probe["accuracy"]) for probe in report["probes"]] == [(0, 1.0), (2, 0.0), (4, 0.0)]
