"""EvolmTrainer: one model co-evolves as policy and rubric generator under a frozen judge, in alternating phases.

Each phase is a stage of a [`SequentialTrainer`]: an [`ESTrainer`] or a [`~trl.GRPOTrainer`] (the type of the role's
config picks it) that starts from the previous phase's saved model. A phase's dataset is built at its start, from that
model, and saved in the phase's folder, so an interrupted run resumes on the same data:

- **policy phase**: the current model writes a rubric for every question (a `static` schedule keeps the starting
  model's rubrics; with `live_rubrics` the model being trained writes them anew at every step); the policy
  is trained on the judge's score of its answer under that rubric (`policy_reward`);
- **rubric phase**: the current model answers every question; preference pairs come from its own outputs
  (`PairMixture`: temporal contrast against older answers from the replay buffer, inferred question,
  rubric-conditioned); the model is trained to write rubrics under which the judge prefers the chosen answer
  (`rubric_reward`) and that the judge can read (`format_reward`).

No reference answer reaches any phase: the datasets hold the prompt, the question, the rubric or the pair, nothing
else. The judge is a separate frozen model (an HTTP server or an in-process model); it never shares weights with the
model being trained.

Each phase can be held near the model it starts from: a GRPO phase by its `beta` (TRL's KL to the reference, here the
phase's starting model, on its own completions), an ES phase by its `kl_anchor_beta`, on a probe of both roles' prompts
(`_anchor_probe`), so that a policy phase does not unlearn the rubrics, nor a rubric phase the answers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from accelerate import PartialState
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..core.noise import derive_seed
from ..sequential.trainer import SequentialTrainer, Stage
from ..trainer.es_config import ESConfig
from ..trainer.output_lock import hold_output_dir
from .config import EvolmConfig
from .diagnostics import held_out_accuracy, phase_diagnostics
from .generation import text_generator
from .guard import RewardHackingGuard
from .judges import Judge, probe_judge
from .live_rubrics import LiveRubrics, with_live_rubrics
from .pairs import PairMixture
from .prompts import render
from .replay import ReplayBuffer
from .rewards import format_reward, policy_reward, rubric_reward
from .rubrics import rubric_is_valid
from .vllm_generation import builds_datasets_with_vllm, dataset_engine, vllm_text_generator

logger = logging.getLogger(__name__)

REPLAY_FILE = "replay_buffer.json"
PHASE_INFO_FILE = "phase.json"
# What a phase may break in the role it does not train: a policy phase the rubrics (their validity, and with a
# verifier their accuracy), a rubric phase the answers (with a verifier their accuracy; without one the judge's score
# of the answers under the model's own rubrics is the proxy).
OTHER_ROLE_HEALTH = {
    "policy": ("rubric_valid_rate", "rubric_accuracy"),
    "rubric": ("answer_accuracy", "held_out_accuracy", "rubric_answer_agreement"),
}


class EvolmTrainer:
    r"""
    Trains one model as policy and rubric generator against a frozen judge (EVOLM), each phase with ES or GRPO.

    Args:
        model (`str`):
            Path or Hub id of the starting model (policy and rubric generator).
        judge ([`Judge`]):
            The frozen judge, e.g. `OpenAIJudge("http://127.0.0.1:8001")` in front of `vllm serve Qwen/Qwen3-1.7B`.
        args ([`EvolmConfig`]):
            The run's configuration.
        train_dataset (`datasets.Dataset`):
            The questions (`args.question_column`). Other columns are dropped: no reference answer reaches training.
        processing_class (`PreTrainedTokenizerBase`, *optional*):
            The model's tokenizer (loaded from `model` by default).

    Example:

    ```python
    from trl import GRPOConfig
    from trl_es import ESConfig
    from trl_es.evolm import EvolmConfig, EvolmTrainer, OpenAIJudge

    trainer = EvolmTrainer(
        model="Qwen/Qwen3-8B",
        judge=OpenAIJudge("http://127.0.0.1:8001"),  # vllm serve Qwen/Qwen3-1.7B --port 8001
        args=EvolmConfig("evolm", policy_args=ESConfig(max_steps=50), rubric_args=GRPOConfig(max_steps=50)),
        train_dataset=questions,
    )
    trainer.train()
    ```
    """

    def __init__(
        self,
        model: str,
        judge: Judge,
        args: EvolmConfig,
        train_dataset: Dataset,
        processing_class=None,
        callbacks=None,
    ):
        if train_dataset is None or args.question_column not in train_dataset.column_names:
            columns = None if train_dataset is None else train_dataset.column_names
            raise ValueError(
                f"train_dataset needs a {args.question_column!r} column with the questions (columns: {columns}). "
                "Rename the column, or set EvolmConfig(question_column=...)."
            )
        _check_judge_is_separate(judge, model)
        self.model = str(model)
        self.judge = judge
        self.args = args
        self.questions = list(train_dataset[args.question_column])
        self.tokenizer = processing_class or AutoTokenizer.from_pretrained(self.model)
        self.output_dir = Path(args.output_dir)
        self.guard = JudgeFailureGuard(args.max_judge_failure_rate)
        callbacks = list(callbacks or [])
        self.live_rubrics = None
        if args.live_rubrics:
            max_tokens = args.policy_args.max_completion_length
            self.live_rubrics = LiveRubrics(
                self.tokenizer, args.prompts.rubric_generation, args.rubric_temperature, max_tokens, args.seed,
                as_prompt=self._prompt,
            )  # fmt: skip
            callbacks.append(self.live_rubrics)
        if args.guard_steps:
            drop, action = args.guard_accuracy_drop, args.guard_action
            callbacks.append(RewardHackingGuard(self._probe_accuracy, args.guard_steps, drop, action))
        self.sequence = SequentialTrainer(
            model=self.model,
            stages=[self._stage(role) for role in args.phases()],
            output_dir=str(self.output_dir),
            processing_class=processing_class,
            callbacks=callbacks,
        )

    def train(self) -> Path:
        """Probe the judge, then run the phases that have not finished; returns the folder of the final model. Holds
        `output_dir`'s lock throughout, from the probe to the last measurement (a second run on the folder is
        refused)."""
        # The phases' SequentialTrainer takes the same lock again; holding it here also covers the probe and the
        # measurement of the last phase, which write into output_dir too.
        with hold_output_dir(self.output_dir, PartialState()):
            probe_judge(self.judge)  # a judge that is down or answers in another format stops the run now, not later
            final = self.sequence.train()
            # Every phase's start measured how the phase before it left both roles; the last phase is measured here.
            index = len(self.args.phases()) - 1
            last = self.sequence.stage_dir(index)
            role = self.args.phases()[index]
            if "after" not in _read_info(last) and PartialState().is_main_process:
                with self._phase_model(str(final), role) as model:
                    rubric_source = self.model if self.args.schedule == "static" else None
                    answers, rubrics = self._both_roles(model, "final", rubric_source)
                    self._record_after(last, role, self._measure(model, answers, rubrics, "final"))
        return final

    def push_to_hub(self, repo_id: str, include_stages: bool = False, private: bool | None = None, **kwargs):
        """As [`SequentialTrainer.push_to_hub`] (same arguments: `revision`, `commit_message`, `token`,
        `dataset_name`): the final model and its card, and with `include_stages` every phase's model."""
        return self.sequence.push_to_hub(repo_id, include_stages=include_stages, private=private, **kwargs)

    # ------------------------------------------------------------------------------------------------------------
    # Phases

    def _stage(self, role: str) -> Stage:
        rules = self.args.rubric_rules
        if role == "policy":
            reward = policy_reward(self.judge, rules=rules)
            if self.live_rubrics is not None:
                reward = with_live_rubrics(reward, self.live_rubrics)
            rewards = [self.guard.wrap(reward)]
            args, build = self.args.policy_args, self._policy_dataset
        else:
            invalid = self.args.invalid_rubric_score
            rubric = rubric_reward(self.judge, mode=self.args.rubric_reward, rules=rules, invalid_score=invalid)
            rewards = [self.guard.wrap(rubric), format_reward(rules)]
            args, build = self.args.rubric_phase_args(), self._rubric_dataset
        probe = self._anchor_probe(args)
        return Stage(args, reward_funcs=rewards, build_dataset=build, name=role, kl_probe_prompts=probe)

    def _anchor_probe(self, args) -> list | None:
        """An anchored ES phase's KL probe: both roles' prompts (answer and rubric) for the first questions, so that
        the role that is not training stays near the phase's start too."""
        if not isinstance(args, ESConfig) or not args.kl_anchor_beta:
            return None
        questions = self.questions[: max(1, args.kl_anchor_probe_size // 2)]
        templates = (self.args.prompts.policy, self.args.prompts.rubric_generation)
        return [self._prompt(render(template, question=q)) for template in templates for q in questions]

    def _policy_dataset(self, model_path: str, stage_dir: Path) -> Dataset:
        """Rubrics for the policy phase's questions, written by the current model (or, `static`, by the starting
        model); the rows carry the rubric for the policy reward."""
        args, prompts = self.args, self.args.prompts
        rubric_source = self.model if args.schedule == "static" else model_path
        with self._phase_model(model_path, "policy") as current:
            static = rubric_source if rubric_source != model_path else None
            answers, rubrics = self._both_roles(current, stage_dir.name, static)
            diagnostics = self._diagnostics(current, answers, rubrics, stage_dir)
        self._record_answers(answers, stage_dir)
        valid = sum(rubric_is_valid(rubric, args.rubric_rules) for rubric in rubrics) / len(rubrics)
        info = {"role": "policy", "rubric_source": rubric_source, "valid_rubric_rate": valid}
        _write_info(stage_dir, {**info, "diagnostics": diagnostics})
        rows = {"prompt": [self._prompt(text) for text in self._rendered(prompts.policy)], "question": self.questions}
        if self.live_rubrics is None:  # live rubrics are written per step: the snapshot only measured the start
            rows["rubric"] = rubrics
        return Dataset.from_dict(rows)

    def _rubric_dataset(self, model_path: str, stage_dir: Path) -> Dataset:
        """Preference pairs from the current model's own answers; the rows carry the pair for the rubric reward."""
        args, prompts = self.args, self.args.prompts
        buffer = self._replay_buffer(stage_dir)
        step = self._policy_steps_before(stage_dir)
        seed = derive_seed(self.args.seed, "pairs", stage_dir.name)
        with self._phase_model(model_path, "rubric") as model:
            answer = self._generator(model, f"{stage_dir.name}/pair-answers", args.answer_temperature)
            infer = self._generator(model, f"{stage_dir.name}/inference", args.inference_temperature)
            answers, rubrics = self._both_roles(model, stage_dir.name)
            pairs, stats = PairMixture(args.pair_weights).build(
                self.questions, answers, rubrics, answer, buffer, step, seed, prompts, infer=infer
            )
            diagnostics = self._diagnostics(model, answers, rubrics, stage_dir, pairs) if pairs else None
        buffer.save(stage_dir / REPLAY_FILE)  # with the random state its sampling advanced
        stats = {source: vars(source_stats) for source, source_stats in stats.items()}
        if not pairs:
            raise RuntimeError(
                f"No preference pair could be built for {stage_dir.name} ({stats}): every pair was a tie or had no "
                "older answer. Use more questions, other pair sources, or a wider replay age window."
            )
        _write_info(stage_dir, {"role": "rubric", "pairs": len(pairs), "stats": stats, "diagnostics": diagnostics})
        return Dataset.from_dict(
            {
                "prompt": [self._prompt(render(prompts.rubric_generation, question=p.question)) for p in pairs],
                "question": [pair.question for pair in pairs],
                "chosen": [pair.chosen for pair in pairs],
                "rejected": [pair.rejected for pair in pairs],
            }
        )

    def _record_answers(self, answers: list[str], stage_dir: Path) -> None:
        """Add the current model's answers to the replay buffer (at the policy step this phase starts from), and save
        the buffer with the phase, so that a resumed run has it."""
        buffer = self._replay_buffer(stage_dir)
        step = self._policy_steps_before(stage_dir)
        for question, answer in zip(self.questions, answers, strict=True):
            buffer.add(step, question, answer)
        buffer.save(stage_dir / REPLAY_FILE)

    def _both_roles(self, model, label: str, rubric_source: str | None = None) -> tuple[list[str], list[str]]:
        """`model`'s answers (at `answer_temperature`) and rubrics (at `rubric_temperature`, written by the model at
        `rubric_source` when given: a static schedule's starting model) for every question."""
        args, prompts = self.args, self.args.prompts
        answers = self._generator(model, f"{label}/answers", args.answer_temperature)(self._rendered(prompts.policy))
        rubric_model = model if rubric_source is None else _load_model(rubric_source)
        write_rubrics = self._generator(rubric_model, f"{label}/rubrics", args.rubric_temperature)
        return answers, write_rubrics(self._rendered(prompts.rubric_generation))

    def _diagnostics(self, model, answers, rubrics, stage_dir: Path, pairs=None) -> dict:
        """What the phase's starting model does as both roles (`trl_es.evolm.diagnostics`), logged and kept in the
        phase's `phase.json`; the phase before it gets the same figures as its `after`, and a log line of what it
        did to the role it did not train."""
        found = self._measure(model, answers, rubrics, stage_dir.name, pairs)
        logger.info(f"{stage_dir.name} starts from a model with {json.dumps(found)}")
        index = stage_index(stage_dir)
        if index > 0:
            self._record_after(self.sequence.stage_dir(index - 1), self.args.phases()[index - 1], found)
        return found

    def _measure(self, model, answers, rubrics, label: str, pairs=None) -> dict:
        args = self.args
        held_out = args.verifier is not None and args.verifier.held_out_questions
        answer_greedily = self._greedy_answers(model, f"{label}/held-out") if held_out else None
        return phase_diagnostics(
            self.questions, answers, rubrics, self.judge, args.rubric_rules, args.verifier, pairs, answer_greedily
        )

    def _record_after(self, stage_dir: Path, role: str, after: dict) -> None:
        """Write into a finished phase's `phase.json` how it left both roles (`after`) and, start against end, the
        health of the role it did not train (`other_role`; see `OTHER_ROLE_HEALTH`)."""
        info = _read_info(stage_dir)
        start = info.get("diagnostics", {})
        other = {
            key: {"start": start.get(key), "after": after.get(key)} for key in OTHER_ROLE_HEALTH[role] if key in after
        }
        _write_info(stage_dir, {**info, "after": after, "other_role": other})
        logger.info(f"{stage_dir.name} ({role} phase) left the other role with {format_other_role(other)}")

    def _greedy_answers(self, model, label: str) -> Callable[[list[str]], list[str]]:
        """questions -> `model`'s greedy answers (held-out accuracy, the guard's probe)."""
        generate = self._generator(model, label, temperature=0.0)
        return lambda questions: generate([render(self.args.prompts.policy, question=q) for q in questions])

    def _probe_accuracy(self, model) -> float:
        """The reward-hacking guard's probe: the phase model's greedy accuracy on the verifier's held-out questions."""
        return held_out_accuracy(self._greedy_answers(model, "guard-probe"), self.args.verifier)

    def _replay_buffer(self, stage_dir: Path) -> ReplayBuffer:
        """The buffer as the latest earlier phase saved it (a new one before the first). Never this phase's own: a
        phase rebuilt after a crash must not see the answers it recorded before."""
        index = stage_index(stage_dir)
        for earlier in sorted(self.output_dir.glob("stage-*"), key=stage_index, reverse=True):
            if stage_index(earlier) < index and (earlier / REPLAY_FILE).is_file():
                return ReplayBuffer.load(earlier / REPLAY_FILE)
        args = self.args
        return ReplayBuffer(args.replay_maxlen, args.replay_min_age, args.replay_max_age, seed=args.seed)

    def _policy_steps_before(self, stage_dir: Path) -> int:
        """Policy steps trained before this phase: what the replay buffer's ages count."""
        roles = self.args.phases()[: stage_index(stage_dir)]
        return self.args.policy_args.max_steps * roles.count("policy")

    def _rendered(self, template: str) -> list[str]:
        return [render(template, question=question) for question in self.questions]

    def _prompt(self, text: str):
        """A conversation when the tokenizer has a chat template (the trainer then applies it), else plain text."""
        return [{"role": "user", "content": text}] if self.tokenizer.chat_template else text

    @contextmanager
    def _phase_model(self, model_path: str, role: str) -> Iterator[object]:
        """What builds a phase's dataset from `model_path`: an in-process vLLM engine when `role` trains with a
        colocated one (`builds_datasets_with_vllm`), shut down before the phase trains, else the model itself."""
        args = self.args.policy_args if role == "policy" else self.args.rubric_args
        if builds_datasets_with_vllm(args, PartialState().num_processes):
            with dataset_engine(model_path, args) as llm:
                yield llm
        else:
            yield _load_model(model_path)

    def _generator(self, model, label: str, temperature: float) -> Callable[[list[str]], list[str]]:
        """`generate(texts)` from `model` (a model, or a vLLM engine) at `temperature`, seeded by `label` (the phase,
        never a path: the run must not depend on where it is written) and the call's number, so a rebuilt dataset is
        the same."""
        max_tokens = self.args.policy_args.max_completion_length
        seed_parts = (self.args.seed, "generate", label)
        make = text_generator if isinstance(model, torch.nn.Module) else vllm_text_generator
        return make(model, self.tokenizer, max_tokens, temperature, seed_parts, as_prompt=self._prompt)


class JudgeFailureGuard:
    """Counts the judge failures (`None` rewards) of the reward functions it wraps and stops training, with the
    figure, once more than `max_rate` of at least `min_calls` scores failed."""

    def __init__(self, max_rate: float, min_calls: int = 32):
        self.max_rate = max_rate
        self.min_calls = min_calls
        self.calls = 0
        self.failures = 0

    def wrap(self, reward_function):
        def guarded(*args, **kwargs):
            rewards = reward_function(*args, **kwargs)
            self.calls += len(rewards)
            self.failures += sum(reward is None for reward in rewards)
            if self.calls >= self.min_calls and self.failures > self.max_rate * self.calls:
                raise RuntimeError(
                    f"The judge failed on {self.failures} of {self.calls} scores ({self.failures / self.calls:.0%}, "
                    f"above max_judge_failure_rate={self.max_rate}). Check the judge server and its answers (see "
                    "`probe_judge`), or raise the limit."
                )
            return rewards

        guarded.__name__ = reward_function.__name__
        return guarded


def _load_model(path: str):
    """A phase's model, loaded once for all the generation its dataset needs."""
    return AutoModelForCausalLM.from_pretrained(path).eval()


def _check_judge_is_separate(judge, model: str) -> None:
    judge_model = getattr(judge, "model", None)
    name = getattr(getattr(judge_model, "config", None), "name_or_path", None)
    if name is not None and Path(str(name)).resolve() == Path(model).resolve():
        raise ValueError(
            f"The judge is the model being trained ({model}). EVOLM's judge is a separate frozen model: load another "
            "checkpoint (the paper uses a small one, Qwen3-1.7B) or serve it with `vllm serve`."
        )


def stage_index(stage_dir: Path) -> int:
    """The position of a phase's folder, `stage-<i>-...`, in the run."""
    return int(stage_dir.name.split("-")[1])


def _read_info(stage_dir: Path) -> dict:
    path = stage_dir / PHASE_INFO_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def format_other_role(other: dict) -> str:
    """A phase's `other_role` record as one line: `key start -> after, ...`."""

    def figure(value) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    return ", ".join(f"{key} {figure(v['start'])} -> {figure(v['after'])}" for key, v in other.items())


def _write_info(stage_dir: Path, info: dict) -> None:
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / PHASE_INFO_FILE).write_text(json.dumps(info, indent=2))
