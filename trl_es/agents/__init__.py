"""Agents under ES: GRPO's tools, environments and rollout functions, run once per population member with that
member's weights.

- `turns.py`: one assistant turn parsed into messages and tool calls, and the token ids that continue a conversation
  after tool results (TRL's public chat-template helpers);
- `tool_calls.py`: running a turn's tool calls (sync and async), counting calls and failures;
- `tool_loop.py`: the multi-turn loop over many rollouts at once, generating each turn through a callback;
- `environments.py`: environment instances per (member, row), reset with the same seed for every member;
- `rollout_functions.py`: a user's `rollout_func`, called once per member with a handle that generates with it.
"""
