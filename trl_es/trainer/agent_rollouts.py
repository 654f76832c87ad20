"""How an ES step generates with GRPO's agent features (`tools`, `environment_factory`, `rollout_func`): every
member runs the whole rollout, every turn, with its own weights.

For a group of members (`groups`: one at a time where the backend writes each member's weights, so that a member's
weights are loaded once for all its turns; all of a generate call's members where the backend batches them):

1. each (member, row) gets its environment instance, reset with the same seed for every member (the episode of row
   `j` is the same for all members), whose observation completes the row's prompt;
2. the first turn: the backend's `generate` (every member on the same prompts, as a plain ES step), or the user's
   `rollout_func`, called once per member;
3. while turns call tools, the tool loop (`trl_es.agents.tool_loop`) runs them and generates the next turn of every
   such rollout through `generate_rows`, each row on its own member's weights and sampled with a seed of its own row
   and round (common random numbers across members).

The completions, their messages (what reward functions read), each member's environments and inputs (with a rollout
function's extra fields) are then scored per member, before the pool resets the instances for the next group.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

from trl.data_utils import is_conversational

from ..agents.environments import EnvironmentPool, environment_factories, environment_tools, with_observation
from ..agents.rollout_functions import (
    MemberHandle,
    call_rollout_func,
    extra_fields,
    rows_with_fields,
    takes_member,
)
from ..agents.tool_loop import ToolLoop, ToolRollout
from ..agents.turns import ToolSuffix
from ..backends.base import OneMemberAtATime, PhaseTimer, RowRequest
from ..compat.trl import async_event_loop
from ..core.noise import Member, derive_seed
from .rollouts import check_prompts_fit, decode_completions, tokenize_prompts, tokenizer_of
from .scoring import MemberCompletions

EMPTY_PROMPT = [{"role": "user", "content": ""}]  # GRPO's prompt for a row without one: the environment writes it


class AgentRollouts:
    """The agent features an `ESTrainer` was given, and the step's generation with them.

    Args:
        tools (`list[Callable]`, *optional*): Tools of every rollout (GRPO's `tools`).
        environment_factory (*optional*): GRPO's `environment_factory`: a factory, or `{name: factory}`.
        rollout_func (`Callable`, *optional*): GRPO's `rollout_func`, or ES's with a `member` argument.
        uses_tools (`bool`, *optional*, defaults to `False`): Whether any rollout has tools (given, or an environment's
            methods): then the `tools/*` metrics are logged, as GRPO logs them.
    """

    def __init__(
        self, tools=None, environment_factory=None, rollout_func: Callable | None = None, uses_tools: bool = False
    ):
        self.tools = list(tools or [])
        factories = environment_factories(environment_factory)
        self.pool = EnvironmentPool(factories) if factories else None
        self.rollout_func = rollout_func
        self.uses_tools = uses_tools or bool(self.tools)

    @property
    def active(self) -> bool:
        return bool(self.tools) or self.pool is not None or self.rollout_func is not None

    def check_settings(self, args) -> None:
        """A rollout function with GRPO's signature generates with the weights the trainer writes into its model or
        its colocated engine: refuse the settings where members' weights are written nowhere it generates. Refuse
        agents on a tensor-parallel engine, whose processes would each run every episode's tools."""
        if self.active and args.use_vllm and args.vllm_mode == "colocate" and args.vllm_tensor_parallel_size > 1:
            raise NotImplementedError(
                f"tools, environment_factory and rollout_func are not supported with vllm_tensor_parallel_size="
                f"{args.vllm_tensor_parallel_size} yet: the processes that share the engine generate each member's "
                "turns together, and each would call the tools and step the environments of every episode. Use "
                "vllm_tensor_parallel_size=1, or vllm_mode='server' with a tensor-parallel `trl-es vllm-serve`."
            )
        if self.rollout_func is None or takes_member(self.rollout_func):
            return
        where = "low-rank members (hooks or LoRA adapters)" if args.perturbation == "lowrank" else None
        if args.use_vllm and args.vllm_mode == "server":
            where = "vllm_mode='server' (the members live in the server)"
        if where is not None:
            raise NotImplementedError(
                f"rollout_func(prompts, trainer) generates with the trainer's model or colocated engine, but with "
                f"{where} no member's weights are written there. Give it a `member` argument and generate with "
                "`member.generate(prompt_ids)`, which uses each member's weights on every backend (see the rollout "
                "functions section of the ES trainer docs)."
            )

    def groups(self, backend, members: list) -> list[list]:
        """The members that generate together: one at a time where the backend writes each member's weights (loaded
        once for all its turns), else all of them (the backend batches them; `population_batch_size` limits it)."""
        if isinstance(backend, OneMemberAtATime):
            return [[member] for member in members]
        return [members]

    def generate(
        self,
        trainer,
        members: list[Member | None],
        member_indices: list[int],
        inputs: list[dict],
        sampling_seed: int | None,
        timer: PhaseTimer,
    ) -> MemberCompletions:
        """The rollouts of `members` (None: the centre) on the step's rows `inputs`."""
        backend = trainer.population.backend
        rows = len(inputs)
        environments = self._environments(members, inputs)
        prompts = [
            [self._prompt(row, environments, m, j, sampling_seed) for j, row in enumerate(inputs)]
            for m in range(len(members))
        ]
        tools = [
            [self.tools + (environment_tools(environments[m][j]) if environments else []) for j in range(rows)]
            for m in range(len(members))
        ]
        multi_turn = any(row_tools for member_tools in tools for row_tools in member_tools)
        if multi_turn and not is_conversational({"prompt": prompts[0][0]}):
            raise ValueError(
                "Tools need conversational prompts (a list of messages per row), which the chat template renders "
                "with the tools' schemas; this dataset's prompts are text."
            )
        member_inputs, tool_masks = [list(inputs) for _ in members], None
        if self.rollout_func is not None:
            prompt_ids, first_turns, member_inputs, tool_masks = self._call_rollout_func(
                trainer, members, member_indices, prompts, inputs, sampling_seed
            )
        else:
            prompt_ids = [
                tokenize_prompts(
                    trainer.processing_class,
                    member_prompts,
                    trainer.chat_template,
                    trainer.chat_template_kwargs,
                    member_tools,
                )  # fmt: skip
                for member_prompts, member_tools in zip(prompts, tools, strict=True)
            ]
            first_turns = self._first_turns(backend, members, prompt_ids, trainer.sampling, sampling_seed, timer)
        for member_prompts, ids in zip(prompts, prompt_ids, strict=True):
            check_prompts_fit(member_prompts, ids, trainer.args.max_completion_length, trainer.context_length)
        completions = [
            decode_completions(trainer.processing_class, member_prompts, ids, turns, member_tools)
            for member_prompts, ids, turns, member_tools in zip(prompts, prompt_ids, first_turns, tools, strict=True)
        ]
        generated = MemberCompletions(prompts, prompt_ids, first_turns, completions, member_inputs, environments)
        generated.tool_masks = tool_masks
        if multi_turn:
            self._continue_with_tools(trainer, members, generated, tools, sampling_seed, timer)
        return generated

    # The steps ----------------------------------------------------------------------------------------------------

    def _environments(self, members: list, inputs: list[dict]) -> list[list] | None:
        if self.pool is None:
            return None
        names = [self.pool.environment_of(row) for row in inputs]
        instances = self.pool.instances(names * len(members))
        return [instances[m * len(inputs) : (m + 1) * len(inputs)] for m in range(len(members))]

    def _prompt(self, row: dict, environments, member: int, row_index: int, sampling_seed: int | None):
        if environments is None:
            return row["prompt"]
        prompt = row.get("prompt", EMPTY_PROMPT)
        seed = None if sampling_seed is None else derive_seed(sampling_seed, "reset", row_index)
        observation = self.pool.reset(environments[member][row_index], row, seed)
        return with_observation(prompt, observation) if is_conversational({"prompt": prompt}) else prompt

    @staticmethod
    def _first_turns(backend, members, prompt_ids, sampling, seed, timer) -> list[list[list[int]]]:
        """Every member's first turn: the backend's `generate` when all members have the same prompts (a plain ES
        step's call), else each row on its member's weights with seed `seed + row`."""
        if all(ids == prompt_ids[0] for ids in prompt_ids):
            if members == [None]:
                return [backend.generate_center(prompt_ids[0], sampling, seed)]
            return backend.generate(members, prompt_ids[0], sampling, seed, timer)
        requests = [
            RowRequest(member, ids, None if seed is None else seed + row)
            for member, member_ids in zip(members, prompt_ids, strict=True)
            for row, ids in enumerate(member_ids)
        ]
        flat = backend.generate_rows(requests, sampling, timer)
        rows = len(prompt_ids[0])
        return [flat[m * rows : (m + 1) * rows] for m in range(len(members))]

    def _call_rollout_func(self, trainer, members, member_indices, prompts, inputs, sampling_seed):
        backend = trainer.population.backend
        prompt_ids, turns, member_inputs, masks = [], [], [], []
        for member, index, member_prompts in zip(members, member_indices, prompts, strict=True):
            handle = MemberHandle(
                index=index,
                seed=None if member is None else member.seed,
                sign=1 if member is None else member.sign,
                sampling_seed=sampling_seed,
                _generate=lambda ids, seeds, member=member: backend.generate_rows(
                    [RowRequest(member, row, seed) for row, seed in zip(ids, seeds, strict=True)], trainer.sampling
                ),
            )
            loaded = (
                backend.member_loaded(member)
                if member is not None and isinstance(backend, OneMemberAtATime)
                else nullcontext()
            )
            with loaded:
                output = call_rollout_func(self.rollout_func, member_prompts, trainer, handle)
            prompt_ids.append([list(ids) for ids in output["prompt_ids"]])
            turns.append([list(ids) for ids in output["completion_ids"]])
            member_inputs.append(rows_with_fields(inputs, extra_fields(output)))
            mask = output.get("env_mask")
            masks.append([list(m) for m in mask] if mask is not None else [[1] * len(ids) for ids in turns[-1]])
        return prompt_ids, turns, member_inputs, masks

    def _continue_with_tools(self, trainer, members, generated: MemberCompletions, tools, sampling_seed, timer):
        rows, budget = len(generated.prompt_ids[0]), trainer.args.max_completion_length
        rollouts, owners = [], []
        for m in range(len(members)):
            for j in range(rows):
                row_tools = tools[m][j]
                seed = None if sampling_seed is None else derive_seed(sampling_seed, "tools", j)
                rollouts.append(
                    ToolRollout(
                        prompt_ids=generated.prompt_ids[m][j],
                        completion_ids=generated.completion_ids[m][j],
                        messages=generated.completions[m][j],
                        tools={tool.__name__: tool for tool in row_tools},
                        schemas=row_tools,
                        seed=seed,
                        tool_mask=None if generated.tool_masks is None else generated.tool_masks[m][j],
                    )
                )
                owners.append((m, j))

        def generate(indices: list[int], contexts: list[list[int]], round_number: int) -> list[list[int]]:
            requests, room = [], 0
            for index, context in zip(indices, contexts, strict=True):
                m, row = owners[index]
                seed = None if sampling_seed is None else derive_seed(sampling_seed, row, "turn", round_number) % 2**31
                requests.append(RowRequest(members[m], context, seed))
                room = max(room, budget - (len(context) - len(generated.prompt_ids[m][row])))
            # A turn cannot use more than what the whole completion has left: no longer turns than that are generated.
            sampling = trainer.sampling.with_(max_tokens=max(room, 1))
            return trainer.population.backend.generate_rows(requests, sampling, timer)

        loop = ToolLoop(
            tokenizer=tokenizer_of(trainer.processing_class),
            suffix=ToolSuffix(trainer.processing_class, trainer.chat_template, trainer.chat_template_kwargs),
            max_completion_length=trainer.args.max_completion_length,
            context_length=trainer.context_length,
            max_iterations=trainer.args.max_tool_calling_iterations,
            run_coroutines=async_event_loop(trainer),
        )
        generated.tool_counts = loop.run(rollouts, generate)
        for index, (m, row) in enumerate(owners):
            generated.completion_ids[m][row] = rollouts[index].completion_ids
            generated.completions[m][row] = rollouts[index].messages
        generated.tool_masks = [[rollouts[m * rows + j].tool_mask for j in range(rows)] for m in range(len(members))]
