"""Coverage evaluation of a trainer's current model, shared by ESTrainer's own evaluation and CoverageEvalCallback.

The caller gives the sampler that holds the weights being trained (`ESTrainer.coverage_sampler()`: the centre of the
population, never a perturbed member; `grpo_sampler(trainer)` for a GRPOTrainer's policy); the trainer gives its
tokenizer, reward functions and processes. The eval prompts are split across processes and the outcomes gathered, so
every process returns the same report. The completions' entropies are computed by the processes that hold the model's
weights: all of them, except in a tensor-parallel ES run, where only the processes that save keep them.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from functools import partial

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from trl.data_utils import is_conversational, maybe_apply_chat_template

from ..compat.trl import colocated_engine, sync_engine_weights
from ..core.released_weights import is_released
from .coverage import (
    CoverageReport,
    EntropyMeasure,
    Judge,
    Sampler,
    TransformersSampler,
    Verdict,
    VLLMEngineSampler,
    answer_judge,
    completion_entropy,
    measure_prompts,
    summarize,
)

logger = logging.getLogger(__name__)


def grpo_sampler(trainer) -> Sampler:
    """The generation path of a `GRPOTrainer`, holding its policy: its colocated vLLM engine (brought up to date with
    the policy first), else `model.generate`."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not trainer.use_vllm:
        return TransformersSampler(model, trainer.processing_class)
    if trainer.vllm_mode == "colocate":
        sync_engine_weights(trainer)
        return VLLMEngineSampler(colocated_engine(trainer))
    logger.warning(
        "GRPOTrainer in vllm_mode='server': coverage is measured with model.generate on the policy, not the server."
    )
    return TransformersSampler(model, trainer.processing_class)


def reward_judge(trainer, dataset: Dataset, success_threshold: float) -> Judge:
    """Correct when the completion's weighted reward from the trainer's reward functions is above
    `success_threshold` (as in training, `None` rewards are skipped; a completion no function scored is a failure).
    Extracts no answers, so Maj@k is not measured."""
    functions = trainer.reward_funcs
    unsupported = [f for f in functions if not callable(f) or isinstance(f, torch.nn.Module)]
    unsupported += [f for f in functions if inspect.iscoroutinefunction(f)]
    if unsupported:
        raise NotImplementedError(
            f"Coverage evaluation judges with plain reward functions, not {unsupported[0]!r} (a reward model or an "
            "async function). Set `eval_answer_extractor` (ESConfig) or pass `extract_answer` (CoverageEvalCallback) "
            "to judge by the reference answers instead."
        )
    weights = trainer.reward_weights.tolist()

    def judge(index: int, texts: list[str], completion_ids: list[list[int]]) -> Verdict:
        example = dataset[index]
        completions = [[{"role": "assistant", "content": t}] for t in texts] if is_conversational(example) else texts
        columns = {key: [value] * len(texts) for key, value in example.items() if key not in ("prompt", "completion")}
        total = torch.zeros(len(texts))
        scored = torch.zeros(len(texts), dtype=torch.bool)
        for function, weight in zip(functions, weights, strict=True):
            rewards = function(
                prompts=[example["prompt"]] * len(texts),
                completions=completions,
                completion_ids=completion_ids,
                trainer_state=trainer.state,
                **columns,
            )
            for row, reward in enumerate(rewards):
                if reward is not None:
                    total[row] += weight * reward
                    scored[row] = True
        return Verdict((scored & (total > success_threshold)).tolist())

    return judge


def measure_trainer(
    trainer,
    sampler: Sampler,
    dataset: Dataset,
    ks: Sequence[int],
    extract_answer: Callable[[str], str | None] | None = None,
    answer_column: str = "answer",
    success_threshold: float = 0.0,
    judge: Callable[[Sequence[str]], Judge] | None = None,
    samples_per_prompt: int | None = None,
    temperature: float = 1.0,
    max_new_tokens: int | None = None,
    seed: int = 1234,
) -> CoverageReport:
    """Coverage of `trainer`'s current model, sampled by `sampler`, on `dataset` (a `prompt` column, plain text or
    conversational).

    With `judge` (a judge factory, e.g. `trl_es.evaluation.benchmarks.math_verify_judge`), the judge it makes of the
    `answer_column` decides; with `extract_answer`, a completion is correct when its extracted answer equals the
    `answer_column` entry, and Maj@k is measured; without either, when its weighted reward is above
    `success_threshold`.
    """
    tokenizer = trainer.processing_class
    if judge is not None:
        judge = judge(dataset[answer_column])
    elif extract_answer is not None:
        judge = answer_judge(dataset[answer_column], extract_answer)
    else:
        judge = reward_judge(trainer, dataset, success_threshold)
    state = trainer.accelerator.state
    indices = list(range(state.process_index, len(dataset), state.num_processes))
    prompts = [maybe_apply_chat_template({"prompt": dataset[i]["prompt"]}, tokenizer)["prompt"] for i in indices]
    prompt_ids = [tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in prompts]
    outcomes = measure_prompts(
        sampler,
        entropies_where_held(trainer.accelerator.unwrap_model(trainer.model), indices, state),
        tokenizer,
        prompt_ids,
        lambda local, texts, ids: judge(indices[local], texts, ids),
        samples_per_prompt or max(ks),
        temperature,
        max_new_tokens or trainer.args.max_completion_length,
        seed,
    )
    gathered = gather_object(list(zip(indices, outcomes, strict=True)))
    return summarize([outcome for _, outcome in sorted(gathered, key=lambda pair: pair[0])], ks)


def entropies_where_held(model, indices: list[int], state) -> EntropyMeasure:
    """How this process measures the entropies of its prompts' completions (`indices`, its prompts' positions in the
    eval set) with `model`: itself, when every process holds the model's weights. Otherwise (the processes of a
    tensor-parallel ES run that save no checkpoint released them) the processes that hold them measure everyone's
    completions, shared out between them, so that no process needs the weights back: for a bf16 70B model, a 140 GB
    copy per process for each evaluation. Collective: every process calls it, and the measure it returns, together."""
    holds = not any(is_released(parameter) for parameter in model.parameters())
    holders = [rank for rank, held in enumerate(gather_object([holds])) if held]
    if len(holders) == state.num_processes:
        return partial(completion_entropy, model)
    if not holders:
        raise RuntimeError(
            "Coverage evaluation measures the completions' entropies with the model, but no process holds its weights "
            "(every one released them). Restore them first (`trl_es.core.released_weights.restore`)."
        )

    def entropies(prompt_ids: list[list[int]], completions: list[list[list[int]]]) -> list[tuple[float, int]]:
        rows = sorted(gather_object(list(zip(indices, prompt_ids, completions, strict=True))), key=lambda r: r[0])
        mine = rows[holders.index(state.process_index) :: len(holders)] if holds else []
        measured = completion_entropy(model, [row[1] for row in mine], [row[2] for row in mine]) if mine else []
        by_index = dict(gather_object([(row[0], value) for row, value in zip(mine, measured, strict=True)]))
        return [by_index[index] for index in indices]

    return entropies
