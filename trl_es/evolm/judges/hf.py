"""A judge run in this process by a Hugging Face causal LM, frozen; and the check that a judge is not the model being
trained."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import torch

from ..prompts import Prompts
from .base import DEFAULT_PROMPTS, PARSE_FAILURE, JudgeError, JudgeStats, check_positive, parse_judge_output
from .prompting import control_token_pattern, judge_prompt, special_tokens_of

MODES = ("generate", "logprob")
# In "logprob" mode the judge's answer is forced to start with this prefix: it skips the reasoning the prompt asks for,
# so one forward pass reads the score's digits (see `HFJudge`).
SCORE_PREFIX = '{"score": '


class HFJudge:
    r"""
    A judge run in this process by a Hugging Face causal LM, frozen (eval mode, no gradients).

    The prompt is `Prompts().judge`, as the user turn of the tokenizer's chat template when it has one. In the
    question, the rubric and the response, every special token of the judge's tokenizer (`all_special_tokens` and the
    added tokens marked special) and every common control-token shape is escaped, and `<<<...>>>` fence markers are
    cut (`trl_es.evolm.judges.prompting`): a response cannot end the user turn or close its fence.

    - `mode="generate"`: greedy decoding of up to `max_new_tokens`, parsed by [`parse_judge_output`].
    - `mode="logprob"`: one forward pass, no decoding. The answer is forced to start `{"score": 0.` and two
      next-token distributions are read, both renormalised over their candidate tokens: at the position after
      `{"score": `, P(0) and P(1) over the tokens "0" and "1"; at the position after `{"score": 0.`, Q(k) over the
      digits "0".."9". The score is the expected value P(1) * 1 + P(0) * sum_k Q(k) * k / 10 (in [0, 1]; a resolution
      of one decimal digit). It needs a tokenizer that spells digits one per token, as Qwen's and Llama's do.

    Items waiting at once (as [`score_all`] sends them) are scored together in batches of `batch_size`, in the event
    loop's thread. The judge must not be the model being trained: see [`check_judge_is_not`].

    Args:
        model (`str` or [`~transformers.PreTrainedModel`]):
            The judge model, or its name or path.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`], *optional*):
            Its tokenizer; loaded from `model` when that is a name.
        mode (`str`, *optional*, defaults to `"generate"`):
            `"generate"` or `"logprob"`.
        max_new_tokens (`int`, *optional*, defaults to `128`):
            Tokens the judge may write in `"generate"` mode.
        prompts ([`Prompts`], *optional*):
            The templates; `prompts.judge` is used.
        batch_size (`int`, *optional*, defaults to `8`):
            Items per forward pass or `generate` call.
        chat_template_kwargs (`dict`, *optional*):
            Passed to `apply_chat_template`, e.g. `{"enable_thinking": False}` for a Qwen3 judge.
    """

    def __init__(
        self,
        model,
        tokenizer=None,
        mode: str = "generate",
        max_new_tokens: int = 128,
        prompts: Prompts = DEFAULT_PROMPTS,
        batch_size: int = 8,
        chat_template_kwargs: dict | None = None,
    ):
        if mode not in MODES:
            raise JudgeError(f"mode must be one of {MODES}, got {mode!r}.")
        check_positive(max_new_tokens=max_new_tokens, batch_size=batch_size)
        self.model, self.tokenizer = _load_judge(model, tokenizer)
        self.model.eval()
        self.mode, self.max_new_tokens, self.prompts, self.batch_size = mode, max_new_tokens, prompts, batch_size
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.stats = JudgeStats()
        self.last_raw: str | None = None
        self.last_error: str | None = None
        self._score_ids = _score_token_ids(self.tokenizer) if mode == "logprob" else None
        self._control_tokens = control_token_pattern(special_tokens_of(self.tokenizer))
        self._waiting: list[tuple[tuple[str, str, str], asyncio.Future]] = []

    def __repr__(self) -> str:
        name = getattr(getattr(self.model, "config", None), "name_or_path", type(self.model).__name__)
        return f"HFJudge({name!r}, mode={self.mode!r})"

    async def score(self, question: str, rubric: str, response: str) -> float | None:
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(((question, rubric, response), future))
        if len(self._waiting) == 1:  # the first waiting item schedules a batch, after the others queued with it
            asyncio.get_running_loop().call_soon(self._score_waiting)
        return await future

    def score_batch(self, items: Sequence[tuple[str, str, str]]) -> list[float | None]:
        """Scores `(question, rubric, response)` items synchronously, `batch_size` at a time."""
        scores = []
        for start in range(0, len(items), self.batch_size):
            prompts = [self.prompt_ids(*item) for item in items[start : start + self.batch_size]]
            scores += self._generate_scores(prompts) if self.mode == "generate" else self._expected_scores(prompts)
        self.stats.requests += len(items)
        return scores

    def _score_waiting(self) -> None:
        waiting, self._waiting = self._waiting, []
        try:
            scores = self.score_batch([item for item, _ in waiting])
        except Exception as error:
            scores, failure = None, error
        for index, (_, future) in enumerate(waiting):
            if future.done():  # cancelled
                continue
            if scores is None:
                future.set_exception(failure)
            else:
                future.set_result(scores[index])

    def prompt(self, question: str, rubric: str, response: str) -> str:
        """The judge prompt of an item (the user turn), its fields neutralised."""
        return judge_prompt(self.prompts.judge, question, rubric, response, self._control_tokens)

    def prompt_ids(self, question: str, rubric: str, response: str) -> list[int]:
        """The token ids the judge model reads for an item: `prompt`, in the chat template when there is one."""
        prompt = self.prompt(question, rubric, response)
        if self.tokenizer.chat_template is None:
            return self.tokenizer(prompt).input_ids
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            tokenize=False,
            add_generation_prompt=True,
            **self.chat_template_kwargs,
        )
        return self.tokenizer(text, add_special_tokens=False).input_ids  # the template already holds special tokens

    @torch.no_grad()
    def _generate_scores(self, prompts: list[list[int]]) -> list[float | None]:
        input_ids, attention_mask = self._left_pad(prompts)
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            pad_token_id=self._pad_id(),
        )
        texts = self.tokenizer.batch_decode(output[:, input_ids.shape[1] :], skip_special_tokens=True)
        scores = []
        for text in texts:
            self.last_raw = text
            score = parse_judge_output(text)
            if score is None:
                self.stats.failures += 1
                self.stats.parse_failures += 1
                self.last_error = PARSE_FAILURE
            scores.append(score)
        return scores

    @torch.no_grad()
    def _expected_scores(self, prompts: list[list[int]]) -> list[float]:
        prefix_ids, first_ids, digit_ids = self._score_ids
        input_ids, attention_mask = self._left_pad([prompt + prefix_ids for prompt in prompts])
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # left padding: positions count real tokens only
        logits = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=3
        ).logits.float()
        # Of the last three positions (the prefix's last token, "0", "."), the first predicts the integer digit and the
        # last the tenths.
        first = torch.softmax(logits[:, 0, first_ids], dim=-1)
        tenths = torch.softmax(logits[:, 2, digit_ids], dim=-1)
        values = torch.arange(10, dtype=torch.float32, device=logits.device) / 10
        scores = (first[:, 1] + first[:, 0] * (tenths * values).sum(-1)).tolist()
        self.last_raw = f'{{"score": {scores[-1]:.4f}}} (expected value; P(1) = {first[-1, 1].item():.4f})'
        return scores

    def _left_pad(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        length = max(len(sequence) for sequence in sequences)
        input_ids = torch.full((len(sequences), length), self._pad_id(), dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
        for row, sequence in enumerate(sequences):
            input_ids[row, length - len(sequence) :] = torch.tensor(sequence)
            attention_mask[row, length - len(sequence) :] = 1
        device = self.model.device
        return input_ids.to(device), attention_mask.to(device)

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return self.tokenizer.eos_token_id if pad is None else pad


def _load_judge(model, tokenizer):
    if isinstance(model, str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        return AutoModelForCausalLM.from_pretrained(model), tokenizer or AutoTokenizer.from_pretrained(model)
    if tokenizer is None:
        raise JudgeError("HFJudge needs the judge model's tokenizer: HFJudge(model, tokenizer, ...).")
    return model, tokenizer


def _score_token_ids(tokenizer) -> tuple[list[int], list[int], list[int]]:
    """`(ids of SCORE_PREFIX + "0.", ids of "0" and "1", ids of "0".."9")` for the logprob read-out; a tokenizer that
    does not spell these digits as tokens of their own after the prefix is a `JudgeError`."""

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids

    def next_token(prefix: str, digit: str) -> int | None:
        before, after = encode(prefix), encode(prefix + digit)
        return after[-1] if len(after) == len(before) + 1 and after[:-1] == before else None

    prefix_ids = encode(SCORE_PREFIX + "0.")
    first_ids = [next_token(SCORE_PREFIX, digit) for digit in "01"]
    digit_ids = [next_token(SCORE_PREFIX + "0.", digit) for digit in "0123456789"]
    spelled = encode(SCORE_PREFIX) + [first_ids[0]] + encode(".")
    if None in first_ids or None in digit_ids or prefix_ids != spelled or len(encode(".")) != 1:
        tokens = tokenizer.convert_ids_to_tokens(encode(SCORE_PREFIX + "1")) + ["|"]
        tokens += tokenizer.convert_ids_to_tokens(encode(SCORE_PREFIX + "0.7"))
        raise JudgeError(
            f"mode='logprob' reads the score digit by digit after {SCORE_PREFIX!r}, but this tokenizer merges the "
            f"digits with their neighbours ({tokens}). Use mode='generate', or a judge whose tokenizer splits digits "
            "(Qwen, Llama)."
        )
    return prefix_ids, first_ids, digit_ids


def check_judge_is_not(judge, trained_model: torch.nn.Module) -> None:
    """Raises a [`JudgeError`] when the judge (an [`HFJudge`] or a model) shares a parameter tensor with
    `trained_model`: EVOLM's judge is frozen and separate, and a judge that trains with the policy can be gamed.

    A remote judge ([`OpenAIJudge`]) holds no parameters here and always passes.
    """
    judge_model = judge if isinstance(judge, torch.nn.Module) else getattr(judge, "model", None)
    if not isinstance(judge_model, torch.nn.Module):
        return
    judge_storages = {key for key in map(_storage_key, judge_model.parameters()) if key is not None}
    shared = [name for name, tensor in trained_model.named_parameters() if _storage_key(tensor) in judge_storages]
    if shared:
        raise JudgeError(
            f"The judge shares {len(shared)} parameter tensor(s) with the model being trained (e.g. {shared[0]!r}): "
            "the judge must be a separate frozen model. Load the judge on its own, e.g. "
            "HFJudge(AutoModelForCausalLM.from_pretrained(judge_name), tokenizer)."
        )


def _storage_key(parameter: torch.Tensor) -> tuple[str, int] | None:
    pointer = parameter.untyped_storage().data_ptr()
    return (str(parameter.device), pointer) if pointer else None  # empty and meta tensors share nothing
