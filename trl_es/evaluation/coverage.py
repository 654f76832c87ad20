"""Held-out evaluation with a verifier: greedy accuracy, Pass@k / Maj@k from sampled completions, and token entropy.

Completions come from a *sampler*: `model.generate` ([`TransformersSampler`]), a vLLM engine ([`VLLMEngineSampler`])
or an ES backend that holds the centre ([`BackendSampler`]). The token entropy is always measured by the Hugging Face
model on the sampled tokens (one teacher-forced forward pass), so it means the same thing whichever sampler generated.
A *judge* turns one prompt's completions into correctness (and, where it extracts answers, the answers Maj@k votes on).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import torch

from ..backends.base import PopulationBackend
from ..backends.hf import TokenIds, left_padded, until_eos
from ..backends.sampling import SamplingSettings
from .metrics import maj_at_k, pass_at_k


@dataclass
class CoverageReport:
    """Mean over prompts of each measurement; `pass_at_k[k]` and `maj_at_k[k]` for every k asked for (`maj_at_k` is
    empty when the judge extracts no answers). The per-prompt values behind each mean (`greedy_correct`,
    `pass_at_k_per_prompt`, `maj_at_k_per_prompt`) are what bootstrap intervals and paired tests resample
    (`trl_es.evaluation.intervals`); `seed` and `problems_digest` say what the measurement can be paired with."""

    greedy_accuracy: float
    pass_at_k: dict[int, float] = field(default_factory=dict)
    maj_at_k: dict[int, float] = field(default_factory=dict)
    token_entropy: float = 0.0  # mean over the sampled completions' tokens, in nats
    success_probs: list[float] = field(default_factory=list)  # per prompt: the fraction of correct samples
    num_prompts: int = 0
    samples_per_prompt: int = 0
    greedy_correct: list[float] = field(default_factory=list)  # per prompt: 1.0 when the greedy completion is correct
    pass_at_k_per_prompt: dict[int, list[float]] = field(default_factory=dict)
    maj_at_k_per_prompt: dict[int, list[float]] = field(default_factory=dict)
    seed: int | None = None  # the sampling seed
    problems_digest: str | None = None  # of the prompts and references, in order (`problems_digest`)

    def as_dict(self) -> dict[str, float]:
        """Flat metric names, as logged: `greedy_accuracy`, `pass@k`, `maj@k`, `entropy`."""
        return {
            "greedy_accuracy": self.greedy_accuracy,
            **{f"pass@{k}": value for k, value in self.pass_at_k.items()},
            **{f"maj@{k}": value for k, value in self.maj_at_k.items()},
            "entropy": self.token_entropy,
        }

    def per_prompt(self) -> dict[str, list[float]]:
        """The per-prompt values of every metric of `as_dict` but the entropy (a mean over tokens, not prompts)."""
        return {
            "greedy_accuracy": self.greedy_correct,
            **{f"pass@{k}": values for k, values in self.pass_at_k_per_prompt.items()},
            **{f"maj@{k}": values for k, values in self.maj_at_k_per_prompt.items()},
        }


def problems_digest(prompts: Sequence, references: Sequence) -> str:
    """A SHA-256 of the prompts (text or conversations) and references, in order: equal digests, same problems."""
    encoded = json.dumps([list(prompts), [str(reference) for reference in references]], sort_keys=True)
    return hashlib.sha256(encoded.encode()).hexdigest()


@dataclass
class PromptOutcome:
    """How one prompt's completions scored: everything the coverage metrics need, small enough to gather."""

    greedy_correct: bool
    correct: list[bool]  # one per sampled completion
    answers: list[str | None] | None  # the extracted answers Maj@k votes on; None when the judge extracts none
    reference: str | None
    entropy_sum: float  # over the sampled completions' tokens, in nats
    token_count: int


class Sampler(Protocol):
    def sample(
        self, prompt_ids: list[list[int]], n: int, temperature: float, max_new_tokens: int, seed: int
    ) -> list[list[list[int]]]:
        """`n` completions (token ids, ending at the first EOS) of every prompt; greedy when `temperature` is 0."""


@dataclass
class Verdict:
    correct: list[bool]
    answers: list[str | None] | None = None
    reference: str | None = None


# judge(prompt index, completion texts, completion ids) -> Verdict
Judge = Callable[[int, list[str], list[list[int]]], Verdict]


def answer_judge(references: Sequence[str], extract_answer: Callable[[str], str | None]) -> Judge:
    """Correct when the extracted answer equals the prompt's reference (as text); the answers feed Maj@k."""

    def judge(index: int, texts: list[str], completion_ids: list[list[int]]) -> Verdict:
        answers = [extract_answer(text) for text in texts]
        reference = str(references[index])
        return Verdict([answer == reference for answer in answers], answers, reference)

    return judge


class TransformersSampler:
    """Samples with `model.generate`, `batch_size` rows at a time, from a fixed seed."""

    def __init__(self, model, tokenizer, batch_size: int = 256):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    @torch.no_grad()
    def sample(self, prompt_ids, n, temperature, max_new_tokens, seed):
        model, pad_id = self.model, self.tokenizer.pad_token_id
        was_training = model.training
        model.eval()
        rows = [ids for ids in prompt_ids for _ in range(n)]
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {}
        completions, eos_ids = [], self._eos_ids()
        devices = [model.device] if model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            for start in range(0, len(rows), self.batch_size):
                input_ids, attention_mask = left_padded(rows[start : start + self.batch_size], pad_id, model.device)
                output = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    **({"do_sample": False} | sampling),
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad_id,
                )
                completions += [until_eos(row, eos_ids) for row in output[:, input_ids.shape[1] :].tolist()]
        model.train(was_training)
        return [completions[i : i + n] for i in range(0, len(completions), n)]

    def _eos_ids(self) -> set[int]:
        return set(TokenIds.of(self.model, self.tokenizer).eos) - {None}


class VLLMEngineSampler:
    """Samples with an in-process `vllm.LLM`, which must already hold the weights to measure."""

    def __init__(self, llm):
        self.llm = llm

    def sample(self, prompt_ids, n, temperature, max_new_tokens, seed):
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=n, temperature=temperature, max_tokens=max_new_tokens, seed=seed + i if temperature else None
            )
            for i in range(len(prompt_ids))
        ]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        return [[list(completion.token_ids) for completion in output.outputs] for output in outputs]


class BackendSampler:
    """Samples the centre through an ES population backend (which holds the centre between steps), with the training
    sampling settings but the sampler's temperature and length."""

    def __init__(self, backend: PopulationBackend, sampling: SamplingSettings):
        self.backend = backend
        self.sampling = sampling

    def sample(self, prompt_ids, n, temperature, max_new_tokens, seed):
        rows = [ids for ids in prompt_ids for _ in range(n)]
        sampling = self.sampling.with_(max_tokens=max_new_tokens, temperature=temperature)
        completions = self.backend.generate_center(rows, sampling, seed)  # row i samples with seed + i
        return [completions[i : i + n] for i in range(0, len(completions), n)]


# Per prompt, the summed entropy of its completions' tokens and their number, given the prompts and their completions
# ([`completion_entropy`] with a model; the processes that hold the weights, in a trainer's evaluation).
EntropyMeasure = Callable[[list[list[int]], list[list[list[int]]]], list[tuple[float, int]]]


def measure_prompts(
    sampler: Sampler,
    entropies: EntropyMeasure,
    tokenizer,
    prompt_ids: list[list[int]],
    judge: Judge,
    samples_per_prompt: int,
    temperature: float = 1.0,
    max_new_tokens: int = 8,
    seed: int = 1234,
) -> list[PromptOutcome]:
    """Greedy and sampled completions of every prompt, judged, with the sampled tokens' entropy measured by
    `entropies`."""
    greedy = sampler.sample(prompt_ids, 1, 0.0, max_new_tokens, seed)
    sampled = sampler.sample(prompt_ids, samples_per_prompt, temperature, max_new_tokens, seed)
    outcomes = []
    for index, (greedy_ids, sampled_ids, (entropy_sum, token_count)) in enumerate(
        zip(greedy, sampled, entropies(prompt_ids, sampled), strict=True)
    ):
        greedy_verdict = judge(index, tokenizer.batch_decode(greedy_ids, skip_special_tokens=True), greedy_ids)
        verdict = judge(index, tokenizer.batch_decode(sampled_ids, skip_special_tokens=True), sampled_ids)
        outcomes.append(
            PromptOutcome(
                greedy_verdict.correct[0],
                verdict.correct,
                verdict.answers,
                verdict.reference,
                entropy_sum,
                token_count,
            )
        )
    return outcomes


def summarize(outcomes: Sequence[PromptOutcome], ks: Sequence[int]) -> CoverageReport:
    """Pass@k, Maj@k (when answers were extracted), greedy accuracy and mean token entropy over the prompts."""
    n = len(outcomes)
    if n == 0:
        raise ValueError("No prompts were measured: the eval set is empty.")
    samples = len(outcomes[0].correct)
    if max(ks) > samples:
        raise ValueError(f"ks={list(ks)} but {samples} samples per prompt: sample at least max(ks) times.")
    counts = [sum(outcome.correct) for outcome in outcomes]
    greedy_correct = [float(outcome.greedy_correct) for outcome in outcomes]
    per_prompt_pass = {k: [pass_at_k(samples, c, k) for c in counts] for k in ks}
    report = CoverageReport(
        greedy_accuracy=sum(greedy_correct) / n,
        pass_at_k={k: sum(values) / n for k, values in per_prompt_pass.items()},
        token_entropy=sum(o.entropy_sum for o in outcomes) / max(sum(o.token_count for o in outcomes), 1),
        success_probs=[c / samples for c in counts],
        num_prompts=n,
        samples_per_prompt=samples,
        greedy_correct=greedy_correct,
        pass_at_k_per_prompt=per_prompt_pass,
    )
    if all(outcome.answers is not None for outcome in outcomes):
        report.maj_at_k_per_prompt = {k: [maj_at_k(o.answers, o.reference, k) for o in outcomes] for k in ks}
        report.maj_at_k = {k: sum(values) / n for k, values in report.maj_at_k_per_prompt.items()}
    return report


def coverage_report(
    model,
    tokenizer,
    prompts: Sequence[str],
    references: Sequence[str],
    extract_answer: Callable[[str], str | None],
    ks: Sequence[int] = (1, 4, 16),
    samples_per_prompt: int = 16,
    temperature: float = 1.0,
    max_new_tokens: int = 8,
    seed: int = 1234,
    sampler: Sampler | None = None,
    judge: Judge | None = None,
) -> CoverageReport:
    """Greedy accuracy, and Pass@k and Maj@k over `samples_per_prompt` sampled completions of every prompt (text),
    judged by comparing `extract_answer(completion)` with the reference, or by `judge` when one is given (e.g.
    math-verify's, `trl_es.evaluation.benchmarks.math_verify_judge`). Samples with `model.generate` unless a `sampler`
    is given."""
    if max(ks) > samples_per_prompt:
        raise ValueError(f"ks={list(ks)} but samples_per_prompt={samples_per_prompt}: sample at least max(ks) times.")
    prompt_ids = [tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in prompts]
    outcomes = measure_prompts(
        sampler or TransformersSampler(model, tokenizer),
        partial(completion_entropy, model),
        tokenizer,
        prompt_ids,
        judge or answer_judge(references, extract_answer),
        samples_per_prompt,
        temperature,
        max_new_tokens,
        seed,
    )
    report = summarize(outcomes, ks)
    report.seed, report.problems_digest = seed, problems_digest(prompts, references)
    return report


@torch.no_grad()
def completion_entropy(
    model, prompt_ids: list[list[int]], completions: list[list[list[int]]], max_logits: int = 2**26
) -> list[tuple[float, int]]:
    """Per prompt: the summed entropy (nats, temperature 1) of the model's next-token distribution at every token of
    its completions, and the number of those tokens. Rows are batched so that no batch holds more than `max_logits`
    logits."""
    rows = [(p, c) for p, prompt_completions in zip(prompt_ids, completions, strict=True) for c in prompt_completions]
    vocab = model.get_output_embeddings().weight.shape[0]
    longest = max((len(p) + len(c) for p, c in rows), default=1)
    batch_size = max(1, max_logits // (longest * vocab))
    was_training = model.training
    model.eval()
    per_row = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        width = max(len(p) + len(c) for p, c in batch)
        input_ids = torch.zeros(len(batch), width, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        scored = torch.zeros(len(batch), width, dtype=torch.bool)  # positions whose next token is a completion token
        for i, (prompt, completion) in enumerate(batch):  # right padding: positions are those of the unpadded row
            input_ids[i, : len(prompt) + len(completion)] = torch.tensor(prompt + completion)
            attention_mask[i, : len(prompt) + len(completion)] = 1
            scored[i, len(prompt) - 1 : len(prompt) + len(completion) - 1] = True
        logits = model(input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device)).logits
        log_probs = logits.float().log_softmax(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1).cpu()
        per_row += [(entropy[i][scored[i]].sum().item(), int(scored[i].sum())) for i in range(len(batch))]
    model.train(was_training)
    counts = [len(prompt_completions) for prompt_completions in completions]
    sums, start = [], 0
    for count in counts:
        chunk = per_row[start : start + count]
        sums.append((sum(s for s, _ in chunk), sum(t for _, t in chunk)))
        start += count
    return sums
