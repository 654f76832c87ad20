"""EvolmTrainer: phases in schedule order, datasets built from the model at each phase start (without reference
answers), ES phases with noise of their own, and a resumed run that reuses what an interrupted one built."""

import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import psutil
import pytest
import torch
from datasets import Dataset, load_from_disk
from scripts.fast_es import fast_es_config, fast_grpo_config
from scripts.paths import EXAMPLES
from transformers import AutoModelForCausalLM, TrainerCallback

from trl_es import ESConfig
from trl_es.core.noise import derive_seed
from trl_es.evolm.judges import JudgeError
from trl_es.evolm.prompts import render
from trl_es.evolm.trainer import EvolmConfig, EvolmTrainer, JudgeFailureGuard
from trl_es.trainer.output_lock import LOCK_FILE, Holder, OutputDirInUseError


class LengthJudge:
    """A deterministic judge: longer responses score higher."""

    async def score(self, question, rubric, response):
        return min(len(response), 20) / 20


class NoiseSeeds(TrainerCallback):
    def __init__(self):
        self.seen = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.seen.append((Path(args.output_dir).name, getattr(args, "noise_seed", "grpo")))


def questions():
    return Dataset.from_dict(
        {"question": [f"What is {k} plus {k}?" for k in range(4)], "answer": [str(2 * k) for k in range(4)]}
    )


def config(tmp_path, **overrides):
    settings = dict(
        policy_args=fast_es_config(tmp_path / "unused", max_steps=1),
        rubric_args=fast_es_config(tmp_path / "unused", max_steps=1),
        rounds=1,
        replay_min_age=0,
        replay_max_age=10,
    )
    return EvolmConfig(str(tmp_path / "evolm"), **{**settings, **overrides})


@pytest.mark.parametrize(
    ("schedule", "phases"),
    [
        ("coevolve", ["policy", "rubric", "policy", "rubric"]),
        ("sequential", ["rubric", "rubric", "policy", "policy"]),
        ("static", ["policy", "policy"]),
    ],
)
def test_the_schedule_orders_the_phases(tmp_path, schedule, phases):
    weights = {"inferred": 1.0, "rubric_conditioned": 1.0}  # no temporal source: sequential needs none
    assert config(tmp_path, schedule=schedule, rounds=2, pair_weights=weights).phases() == phases


def test_bad_configurations_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="schedule='alternate'"):
        config(tmp_path, schedule="alternate")
    with pytest.raises(ValueError, match="rounds must be"):
        config(tmp_path, rounds=0)
    with pytest.raises(TypeError, match="policy_args must be an ESConfig"):
        config(tmp_path, policy_args={"max_steps": 1})
    with pytest.raises(ValueError, match="inferred"):  # rubric phases before any policy step: no old answer yet
        config(tmp_path, schedule="sequential", pair_weights={"temporal": 1.0})


def test_temperatures_and_rubric_reward_weights_are_checked_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="inference_temperature must be a finite number >= 0"):
        config(tmp_path, inference_temperature=-0.1)
    with pytest.raises(ValueError, match="reward weights are all 0"):
        config(tmp_path, rubric_reward_weight=0.0, format_reward_weight=0.0)
    with pytest.raises(ValueError, match="Set those instead"):
        config(tmp_path, rubric_args=fast_es_config(tmp_path / "unused", max_steps=1, reward_weights=[1.0, 1.0]))
    with pytest.raises(ValueError, match="Set rubric_temperature instead"):
        config(tmp_path, rubric_args=fast_es_config(tmp_path / "unused", max_steps=1, temperature=1.0))
    with pytest.raises(ValueError, match="invalid_rubric_score must be finite"):
        config(tmp_path, invalid_rubric_score=float("-inf"))


def test_an_es_rubric_phase_samples_the_rubrics_policy_phases_read_and_weighs_its_rewards(tmp_path):
    args = config(tmp_path, rubric_temperature=0.7, format_reward_weight=0.25)
    phase_args = args.rubric_phase_args()
    assert phase_args.temperature == 0.7 and phase_args.reward_weights == [1.0, 0.25]
    assert args.rubric_args.temperature == 0.0 and args.rubric_args.reward_weights is None  # the user's config
    grpo = config(tmp_path, rubric_args=fast_grpo_config(tmp_path / "unused", max_steps=1)).rubric_phase_args()
    assert grpo.temperature == fast_grpo_config(tmp_path / "unused").temperature  # GRPO samples its own group


def test_phase_datasets_sample_rubrics_answers_and_inferred_questions_at_their_temperatures(
    tmp_path, tiny_model_path, monkeypatch
):
    temperatures = {}
    generator = EvolmTrainer._generator

    def recording(self, model, label, temperature, **kwargs):
        temperatures[label] = temperature
        return generator(self, model, label, temperature, **kwargs)

    monkeypatch.setattr(EvolmTrainer, "_generator", recording)
    args = config(tmp_path, rubric_temperature=0.6, answer_temperature=0.9, inference_temperature=0.2)
    trainer = EvolmTrainer(tiny_model_path, LengthJudge(), args, questions())
    trainer._policy_dataset(tiny_model_path, Path(args.output_dir) / "stage-0-policy-es")
    trainer._rubric_dataset(tiny_model_path, Path(args.output_dir) / "stage-1-rubric-es")
    assert temperatures == {
        "stage-0-policy-es/rubrics": 0.6,
        "stage-0-policy-es/answers": 0.9,
        "stage-1-rubric-es/answers": 0.9,
        "stage-1-rubric-es/pair-answers": 0.9,
        "stage-1-rubric-es/rubrics": 0.6,
        "stage-1-rubric-es/inference": 0.2,
    }
    infos = {
        phase: json.loads((Path(args.output_dir) / phase / "phase.json").read_text())
        for phase in ("stage-0-policy-es", "stage-1-rubric-es")
    }
    for info in infos.values():  # each logs how it found both roles, verifier-free
        assert set(info["diagnostics"]) == {"rubric_valid_rate", "rubric_answer_agreement"}
    # The policy phase is told, once the next phase has measured the model it left, what it did to the rubrics.
    policy = infos["stage-0-policy-es"]
    assert policy["after"] == infos["stage-1-rubric-es"]["diagnostics"]
    start, after = policy["diagnostics"]["rubric_valid_rate"], policy["after"]["rubric_valid_rate"]
    assert policy["other_role"] == {"rubric_valid_rate": {"start": start, "after": after}}


def test_an_anchored_es_phase_probes_both_roles_prompts(tmp_path, tiny_model_path):
    anchored = fast_es_config(tmp_path / "unused", max_steps=1, kl_anchor_beta=0.1, kl_anchor_probe_size=4)
    args = config(tmp_path, policy_args=anchored, rubric_args=fast_grpo_config(tmp_path / "unused", beta=0.1))
    trainer = EvolmTrainer(tiny_model_path, LengthJudge(), args, questions())
    policy, rubric = trainer.sequence.stages
    asked = [f"What is {k} plus {k}?" for k in range(2)]
    expected = [
        render(template, question=q)
        for template in (args.prompts.policy, args.prompts.rubric_generation)
        for q in asked
    ]
    assert [turns[0]["content"] for turns in policy.kl_probe_prompts] == expected
    assert rubric.kl_probe_prompts is None and rubric.args.beta == 0.1  # GRPO's own KL, to the phase's start


def test_a_training_set_without_the_question_column_is_refused(tmp_path, tiny_model_path):
    with pytest.raises(ValueError, match="'question' column"):
        EvolmTrainer(tiny_model_path, LengthJudge(), config(tmp_path), Dataset.from_dict({"prompt": ["q"]}))


def test_the_trained_model_cannot_be_its_own_judge(tmp_path, tiny_model_path):
    judge = LengthJudge()
    judge.model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    with pytest.raises(ValueError, match="separate frozen model"):
        EvolmTrainer(tiny_model_path, judge, config(tmp_path), questions())


class LockWatchingJudge:
    """A judge that fails its startup probe, noting for each call the pid that held the run's output_dir lock."""

    def __init__(self, output_dir):
        self.lock, self.holders = Path(output_dir) / LOCK_FILE, []

    async def score(self, question, rubric, response):
        self.holders.append(json.loads(self.lock.read_text())["pid"] if self.lock.exists() else None)
        return None


def test_a_run_holds_its_output_dir_from_the_judge_probe_on_and_releases_it_when_it_fails(tmp_path, tiny_model_path):
    args = config(tmp_path)
    judge = LockWatchingJudge(args.output_dir)
    trainer = EvolmTrainer(tiny_model_path, judge, args, questions())
    with pytest.raises(JudgeError, match="failed its startup probe"):
        trainer.train()
    assert judge.holders == [os.getpid()]
    assert not (Path(args.output_dir) / LOCK_FILE).exists()


def test_a_second_run_on_a_held_output_dir_is_refused_naming_the_holder_before_the_judge_probe(
    tmp_path, tiny_model_path
):
    args = config(tmp_path)
    judge = LockWatchingJudge(args.output_dir)
    trainer = EvolmTrainer(tiny_model_path, judge, args, questions())
    first_run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        # The lock as a run in that live process of this host holds it.
        started = psutil.Process(first_run.pid).create_time()
        holder = replace(Holder.this_process(), pid=first_run.pid, process_started=started)
        Path(args.output_dir).mkdir(parents=True)
        (Path(args.output_dir) / LOCK_FILE).write_text(json.dumps(asdict(holder)))
        held_by = f"in use by another training run: pid {first_run.pid} on host {socket.gethostname()}"
        with pytest.raises(OutputDirInUseError, match=held_by):
            trainer.train()
    finally:
        first_run.kill()
        first_run.wait()
    assert judge.holders == []  # refused before the probe, and before any phase
    assert json.loads((Path(args.output_dir) / LOCK_FILE).read_text())["pid"] == first_run.pid  # left alone
    assert not list(Path(args.output_dir).glob("stage-*"))


def test_the_judge_failure_guard_stops_with_the_figure():
    guard = JudgeFailureGuard(max_rate=0.25, min_calls=4)
    flaky = guard.wrap(lambda completions, **kwargs: [None, 1.0, 1.0, 1.0])
    failing = guard.wrap(lambda completions, **kwargs: [None] * len(completions))
    assert flaky(["a"] * 4) == [None, 1.0, 1.0, 1.0]  # 1 of 4 failed: at the limit, not above it
    with pytest.raises(RuntimeError, match=r"failed on 5 of 8 scores \(62%, above max_judge_failure_rate=0.25\)"):
        failing(["a"] * 4)  # the guard counts every reward function it wraps


@pytest.mark.slow
def test_coevolution_builds_each_phase_from_the_current_model_and_resumes_on_the_same_data(tmp_path, tiny_model_path):
    args = config(tmp_path, rubric_args=fast_grpo_config(tmp_path / "unused", max_steps=1))
    seeds = NoiseSeeds()
    final = EvolmTrainer(tiny_model_path, LengthJudge(), args, questions(), callbacks=[seeds]).train()

    policy, rubric = Path(args.output_dir) / "stage-0-policy-es", Path(args.output_dir) / "stage-1-rubric-grpo"
    assert final == rubric / "final" and (policy / "final" / "config.json").is_file()
    policy_rows, rubric_rows = load_from_disk(str(policy / "dataset")), load_from_disk(str(rubric / "dataset"))
    assert set(policy_rows.column_names) == {"prompt", "question", "rubric"}  # no reference answer reaches training
    assert set(rubric_rows.column_names) == {"prompt", "question", "chosen", "rejected"}
    assert policy_rows["question"] == questions()["question"]
    assert all(
        chosen != rejected for chosen, rejected in zip(rubric_rows["chosen"], rubric_rows["rejected"], strict=True)
    )
    rubric_info = json.loads((rubric / "phase.json").read_text())
    assert rubric_info["pairs"] == len(rubric_rows)
    # The last phase is measured at the end: what the rubric phase did to the answers (verifier-free: the proxy).
    assert set(rubric_info["other_role"]) == {"rubric_answer_agreement"}
    assert (
        rubric_info["other_role"]["rubric_answer_agreement"]["start"]
        == rubric_info["diagnostics"]["rubric_answer_agreement"]
    )
    assert (policy / "replay_buffer.json").is_file() and (rubric / "replay_buffer.json").is_file()
    assert [name for name, _ in seeds.seen] == [policy.name, rubric.name]
    weights = {name: p.detach().clone() for name, p in AutoModelForCausalLM.from_pretrained(final).named_parameters()}

    # Interrupted after the rubric phase built its data: the resumed run trains on the same data, to the same model.
    built = (rubric / "dataset").stat().st_mtime_ns
    for leftover in ("final", "checkpoint-1"):
        shutil.rmtree(rubric / leftover, ignore_errors=True)
    EvolmTrainer(tiny_model_path, LengthJudge(), args, questions()).train()
    assert (rubric / "dataset").stat().st_mtime_ns == built
    resumed = dict(AutoModelForCausalLM.from_pretrained(final).named_parameters())
    assert all(torch.equal(weights[name], resumed[name].detach()) for name in weights)


@pytest.mark.slow
def test_every_es_phase_draws_noise_of_its_own(tmp_path, tiny_model_path):
    args = config(tmp_path, schedule="static", rounds=2)
    assert isinstance(args.policy_args, ESConfig)
    seeds = NoiseSeeds()
    EvolmTrainer(tiny_model_path, LengthJudge(), args, questions(), callbacks=[seeds]).train()
    first, second = (seed for _, seed in seeds.seen)
    assert first is None  # the first stage keeps the config's seed
    assert second == derive_seed(args.policy_args.seed, "stage", 1)


@pytest.mark.slow
def test_the_example_runs_offline_on_tiny_models(tmp_path):
    import subprocess
    import sys

    example = EXAMPLES / "evolm.py"
    command = [sys.executable, str(example), "--tiny", "--rounds", "1", "--output_dir", str(tmp_path / "run")]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "run" / "stage-1-rubric-grpo" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "stage-1-rubric-grpo" / "final" / "README.md").is_file()  # the run's model card
