"""EvolmTrainer: one model co-evolves as policy and rubric generator under a frozen judge, in alternating phases.

Each phase is a stage of a [`SequentialTrainer`]: an [`ESTrainer`] or a [`~trl.GRPOTrainer`] (the type of the role's
config picks it) that starts from the previous phase's saved model. A phase's dataset is built at its start, from that
model, and saved in the phase's folder, so an interrupted run resumes on the same data:

- **policy phase**: the current model writes a rubric for every question (a `static` schedule keeps the starting
  model's rubrics); the policy is trained on the judge's score of its answer under that rubric (`policy_reward`);
- **rubric phase**: the current model answers every question; preference pairs come from its own outputs
  (`PairMixture`: temporal contrast against older answers from the replay buffer, inferred question,
  rubric-conditioned); the model is trained to write rubrics under which the judge prefers the chosen answer
  (`rubric_reward`) and that the judge can read (`format_reward`).

No reference answer reaches any phase: the datasets hold the prompt, the question, the rubric or the pair, nothing
else. The judge is a separate frozen model (an HTTP server or an in-process model); it never shares weights with the
model being trained. For GRPO phases with `beta > 0` the KL reference is the model the phase starts from.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from ..backends.hf import TokenIds, hf_generate
from ..backends.sampling import SamplingSettings
from ..core.noise import derive_seed
from ..sequential.trainer import SequentialTrainer, Stage
from ..trainer.es_config import ESConfig
from ..trainer.rollouts import tokenize_prompts
from .judges import Judge, probe_judge
from .pairs import SOURCES as PAIR_SOURCES
from .pairs import PairMixture, ReplayBuffer, check_pair_sources
from .prompts import Prompts, render
from .rewards import format_reward, policy_reward, rubric_reward
from .rubrics import RubricRules, rubric_is_valid

SCHEDULES = ("coevolve", "sequential", "static")
REPLAY_FILE = "replay_buffer.json"
PHASE_INFO_FILE = "phase.json"


@dataclass
class EvolmConfig:
    r"""
    Configuration of an EVOLM run: the two roles' training configs and how the phases alternate.

    Args:
        output_dir (`str`):
            Folder of the whole run; phase `i` trains in `output_dir/stage-<i>-<policy|rubric>-<es|grpo>`.
        policy_args ([`ESConfig`] or [`~trl.GRPOConfig`]):
            Training config of every policy phase (its `max_steps` is the phase length, 50 in the paper).
        rubric_args ([`ESConfig`] or [`~trl.GRPOConfig`]):
            Training config of every rubric phase.
        schedule (`str`, *optional*, defaults to `"coevolve"`):
            `"coevolve"`: policy and rubric phases alternate, policy first. `"sequential"`: all rubric phases first,
            then all policy phases. `"static"`: policy phases only; the rubrics are the starting model's (a rubric
            generator that is never trained).
        rounds (`int`, *optional*, defaults to `2`):
            Number of policy phases (and of rubric phases, except with `"static"`).
        question_column (`str`, *optional*, defaults to `"question"`):
            The column of the training set that holds the questions (plain text).
        rubric_reward (`str`, *optional*, defaults to `"indicator"`):
            The rubric reward: `"indicator"` 1[J+ > J−] (the authors' default), `"margin"` J+ − J−, or
            `"log_sigmoid"` log σ(J+ − J−) (the paper's objective).
        pair_weights (`dict[str, float]`, *optional*, defaults to equal weights of the three sources):
            Mixture of pair sources: `"temporal"`, `"inferred"`, `"rubric_conditioned"`.
        replay_maxlen, replay_min_age, replay_max_age (`int`, *optional*, default `2048`, `20`, `100`):
            The replay buffer of (policy step, question, answer) behind temporal contrast, and the age window (in
            policy steps) of the answers it pairs with.
        max_judge_failure_rate (`float`, *optional*, defaults to `0.2`):
            A phase stops, with the figure, once more than this fraction of its judge calls failed (after at least
            32 calls).
        answer_temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature of the answers and rubrics generated to build the phases' datasets.
        seed (`int`, *optional*, defaults to `42`):
            Seed of dataset building (pair sources, sampling); every ES phase also draws noise of its own.
        rubric_rules ([`RubricRules`], *optional*):
            The rubric format check.
        prompts ([`Prompts`], *optional*):
            The prompt templates.
    """

    output_dir: str
    policy_args: ESConfig | GRPOConfig
    rubric_args: ESConfig | GRPOConfig
    schedule: str = "coevolve"
    rounds: int = 2
    question_column: str = "question"
    rubric_reward: str = "indicator"
    pair_weights: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PAIR_SOURCES, 1.0))
    replay_maxlen: int = 2048
    replay_min_age: int = 20
    replay_max_age: int = 100
    max_judge_failure_rate: float = 0.2
    answer_temperature: float = 1.0
    seed: int = 42
    rubric_rules: RubricRules = field(default_factory=RubricRules)
    prompts: Prompts = field(default_factory=Prompts)

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Unknown schedule={self.schedule!r}; use one of {SCHEDULES}.")
        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1, got {self.rounds!r}.")
        for name in ("policy_args", "rubric_args"):
            if not isinstance(getattr(self, name), GRPOConfig):
                raise TypeError(
                    f"{name} must be an ESConfig (ES phases) or a GRPOConfig (GRPO phases), got "
                    f"{type(getattr(self, name)).__name__}."
                )
        if not 0.0 <= self.max_judge_failure_rate <= 1.0:
            raise ValueError(f"max_judge_failure_rate must be in [0, 1], got {self.max_judge_failure_rate}.")
        # The first rubric phase of a `sequential` schedule comes before any policy step: no answer is old enough.
        check_pair_sources(self.pair_weights, self.schedule == "sequential")

    def phases(self) -> list[str]:
        """The roles of the phases in order."""
        if self.schedule == "coevolve":
            return ["policy", "rubric"] * self.rounds
        if self.schedule == "sequential":
            return ["rubric"] * self.rounds + ["policy"] * self.rounds
        return ["policy"] * self.rounds


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
        self.sequence = SequentialTrainer(
            model=self.model,
            stages=[self._stage(role) for role in args.phases()],
            output_dir=str(self.output_dir),
            processing_class=processing_class,
            callbacks=callbacks,
        )

    def train(self) -> Path:
        """Probe the judge, then run the phases that have not finished; returns the folder of the final model."""
        probe_judge(self.judge)  # a judge that is down or answers in another format stops the run now, not later
        return self.sequence.train()

    def push_to_hub(self, repo_id: str, include_stages: bool = False, private: bool | None = None, **kwargs):
        """As [`SequentialTrainer.push_to_hub`] (same arguments: `revision`, `commit_message`, `token`,
        `dataset_name`): the final model and its card, and with `include_stages` every phase's model."""
        return self.sequence.push_to_hub(repo_id, include_stages=include_stages, private=private, **kwargs)

    # ------------------------------------------------------------------------------------------------------------
    # Phases

    def _stage(self, role: str) -> Stage:
        rules = self.args.rubric_rules
        if role == "policy":
            rewards = [self.guard.wrap(policy_reward(self.judge, rules=rules))]
            return Stage(self.args.policy_args, reward_funcs=rewards, build_dataset=self._policy_dataset, name=role)
        rubric = self.guard.wrap(rubric_reward(self.judge, mode=self.args.rubric_reward, rules=rules))
        rewards = [rubric, format_reward(rules)]
        return Stage(self.args.rubric_args, reward_funcs=rewards, build_dataset=self._rubric_dataset, name=role)

    def _policy_dataset(self, model_path: str, stage_dir: Path) -> Dataset:
        """Rubrics for the policy phase's questions, written by the current model (or, `static`, by the starting
        model); the rows carry the rubric for the policy reward."""
        prompts = self.args.prompts
        rubric_source = self.model if self.args.schedule == "static" else model_path
        current = _load_model(model_path)
        rubric_model = _load_model(rubric_source) if rubric_source != model_path else current
        rubrics = self._generator(rubric_model, f"{stage_dir.name}/rubrics")(self._rendered(prompts.rubric_generation))
        self._record_answers(self._generator(current, f"{stage_dir.name}/answers"), stage_dir)
        valid = sum(rubric_is_valid(rubric, self.args.rubric_rules) for rubric in rubrics) / len(rubrics)
        _write_info(stage_dir, {"role": "policy", "rubric_source": rubric_source, "valid_rubric_rate": valid})
        policy_prompts = [self._prompt(text) for text in self._rendered(prompts.policy)]
        return Dataset.from_dict({"prompt": policy_prompts, "question": self.questions, "rubric": rubrics})

    def _rubric_dataset(self, model_path: str, stage_dir: Path) -> Dataset:
        """Preference pairs from the current model's own answers; the rows carry the pair for the rubric reward."""
        prompts = self.args.prompts
        generate = self._generator(_load_model(model_path), stage_dir.name)
        answers = generate(self._rendered(prompts.policy))
        rubrics = generate(self._rendered(prompts.rubric_generation))
        buffer = self._replay_buffer(stage_dir)
        step = self._policy_steps_before(stage_dir)
        seed = derive_seed(self.args.seed, "pairs", stage_dir.name)
        pairs, stats = PairMixture(self.args.pair_weights).build(
            self.questions, answers, rubrics, generate, buffer, step, seed, prompts
        )
        buffer.save(stage_dir / REPLAY_FILE)  # with the random state its sampling advanced
        stats = {source: vars(source_stats) for source, source_stats in stats.items()}
        if not pairs:
            raise RuntimeError(
                f"No preference pair could be built for {stage_dir.name} ({stats}): every pair was a tie or had no "
                "older answer. Use more questions, other pair sources, or a wider replay age window."
            )
        _write_info(stage_dir, {"role": "rubric", "pairs": len(pairs), "stats": stats})
        return Dataset.from_dict(
            {
                "prompt": [self._prompt(render(prompts.rubric_generation, question=p.question)) for p in pairs],
                "question": [pair.question for pair in pairs],
                "chosen": [pair.chosen for pair in pairs],
                "rejected": [pair.rejected for pair in pairs],
            }
        )

    def _record_answers(self, generate: Callable[[list[str]], list[str]], stage_dir: Path) -> None:
        """Add the current model's answers to the replay buffer (at the policy step this phase starts from), and save
        the buffer with the phase, so that a resumed run has it."""
        buffer = self._replay_buffer(stage_dir)
        step = self._policy_steps_before(stage_dir)
        for question, answer in zip(self.questions, generate(self._rendered(self.args.prompts.policy)), strict=True):
            buffer.add(step, question, answer)
        buffer.save(stage_dir / REPLAY_FILE)

    def _replay_buffer(self, stage_dir: Path) -> ReplayBuffer:
        """The buffer as the latest earlier phase saved it (a new one before the first). Never this phase's own: a
        phase rebuilt after a crash must not see the answers it recorded before."""
        index = _stage_index(stage_dir)
        for earlier in sorted(self.output_dir.glob("stage-*"), key=_stage_index, reverse=True):
            if _stage_index(earlier) < index and (earlier / REPLAY_FILE).is_file():
                return ReplayBuffer.load(earlier / REPLAY_FILE)
        args = self.args
        return ReplayBuffer(args.replay_maxlen, args.replay_min_age, args.replay_max_age, seed=args.seed)

    def _policy_steps_before(self, stage_dir: Path) -> int:
        """Policy steps trained before this phase: what the replay buffer's ages count."""
        roles = self.args.phases()[: _stage_index(stage_dir)]
        return self.args.policy_args.max_steps * roles.count("policy")

    def _rendered(self, template: str) -> list[str]:
        return [render(template, question=question) for question in self.questions]

    def _prompt(self, text: str):
        """A conversation when the tokenizer has a chat template (the trainer then applies it), else plain text."""
        return [{"role": "user", "content": text}] if self.tokenizer.chat_template else text

    def _generator(self, model, label: str, batch_size: int = 64) -> Callable[[list[str]], list[str]]:
        """`generate(texts)`: one sampled completion per prompt from `model`, with `model.generate`; seeded by `label`
        (the phase, never a path: the run must not depend on where it is written) and the call's number, so a rebuilt
        dataset is the same."""
        tokens = TokenIds.of(model, self.tokenizer)
        sampling = SamplingSettings(
            max_tokens=self.args.policy_args.max_completion_length, temperature=self.args.answer_temperature
        )
        kwargs = sampling.generate_kwargs(tokens.pad, tokens.bos, list(tokens.eos))
        calls = itertools.count()

        @torch.no_grad()
        def generate(texts: Sequence[str]) -> list[str]:
            prompt_ids = tokenize_prompts(self.tokenizer, [self._prompt(text) for text in texts])
            seed = derive_seed(self.args.seed, "generate", label, next(calls))
            completions = []
            for start in range(0, len(prompt_ids), batch_size):
                ids = hf_generate(model, prompt_ids[start : start + batch_size], kwargs, tokens, seed + start)
                completions += self.tokenizer.batch_decode(ids, skip_special_tokens=True)
            return completions

        return generate


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


def _stage_index(stage_dir: Path) -> int:
    return int(stage_dir.name.split("-")[1])


def _write_info(stage_dir: Path, info: dict) -> None:
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / PHASE_INFO_FILE).write_text(json.dumps(info, indent=2))
