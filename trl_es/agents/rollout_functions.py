"""A user's `rollout_func` under ES: called once per member, generating with that member's weights.

GRPO calls `rollout_func(prompts, trainer)` once per batch and the function generates with the policy (the trainer's
model or its vLLM engine). ES has a population: it calls the function once per member, and

- a function with GRPO's signature finds the member's weights where it generates (the trainer writes them into its
  model, or into the colocated vLLM engine, before the call), so a GRPO rollout function works unchanged with the
  backends that write weights;
- a function that also takes `member` gets a [`MemberHandle`]: the member's index and seed, and `generate`, which
  generates with the member's weights on any backend (low-rank members and a vLLM server included).

Either returns GRPO's dict: `prompt_ids`, `completion_ids` and `logprobs` (one entry per prompt; `logprobs` may be
None, ES does not read it), and any other field, which reward functions receive (a list: one value per prompt; a
scalar: the same for every prompt).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")


@dataclass
class MemberHandle:
    """The member a rollout function generates for.

    Attributes:
        index (`int`): The member's index in the step's population (its order in the update).
        seed (`int`): The seed of its noise; `sign` is `+1` or `-1` (antithetic pairs share a seed).
        sampling_seed (`int`): The step's sampling seed: row `j` of every member samples with `sampling_seed + j`.
    """

    index: int
    seed: int
    sign: int
    sampling_seed: int | None
    _generate: Callable[[Sequence[list[int]], Sequence[int | None]], list[list[int]]]

    def generate(self, prompt_ids: Sequence[list[int]], seeds: Sequence[int | None] | None = None) -> list[list[int]]:
        """Completions of `prompt_ids` with this member's weights and the trainer's sampling settings, each up to its
        first EOS. Row `j` samples with `seeds[j]` (default: `sampling_seed + j`, as every member's row `j`)."""
        if seeds is None:
            base = self.sampling_seed
            seeds = [None if base is None else base + row for row in range(len(prompt_ids))]
        return self._generate(list(prompt_ids), list(seeds))


def takes_member(rollout_func: Callable) -> bool:
    """Whether `rollout_func` takes ES's `member` argument (else it has GRPO's `(prompts, trainer)`)."""
    try:
        parameters = inspect.signature(rollout_func).parameters
    except (TypeError, ValueError):
        return False
    return "member" in parameters


def call_rollout_func(rollout_func: Callable, prompts: list, trainer, member: MemberHandle) -> dict:
    """`rollout_func`'s output for `member`'s rollouts of `prompts`, checked: GRPO's required keys, one entry per
    prompt."""
    if takes_member(rollout_func):
        output = rollout_func(prompts, trainer, member=member)
    else:
        output = rollout_func(prompts, trainer)
    if not isinstance(output, dict):
        raise TypeError(f"rollout_func must return a dict with {list(REQUIRED_KEYS)}, got {type(output).__name__}.")
    missing = [key for key in REQUIRED_KEYS if key not in output]
    if missing:
        raise ValueError(f"rollout_func must return keys {sorted(missing)} in its output dict.")
    for key in ("prompt_ids", "completion_ids"):
        if len(output[key]) != len(prompts):
            raise ValueError(
                f"rollout_func returned {len(output[key])} {key} for {len(prompts)} prompts: one per prompt (the "
                "step's batch, each prompt repeated num_generations times, as GRPO passes it)."
            )
    return output


def extra_fields(output: dict) -> dict:
    """The fields of a rollout function's output that reward functions receive (all but the required ones and
    `env_mask`, which marks the model's own tokens)."""
    return {key: value for key, value in output.items() if key not in (*REQUIRED_KEYS, "env_mask")}


def rows_with_fields(rows: list[dict], fields: dict) -> list[dict]:
    """Copies of the dataset `rows` with a rollout function's extra `fields` merged in, as GRPO merges them: a list
    gives row `i` its `i`-th value, anything else is every row's."""
    merged = []
    for index, row in enumerate(rows):
        row = dict(row)
        for key, values in fields.items():
            if isinstance(values, list):
                if index < len(values):
                    row[key] = values[index]
            else:
                row[key] = values
        merged.append(row)
    return merged
