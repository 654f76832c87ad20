"""A reward function that counts the completions it scores, for tests that run a training script in-process and
check how many steps it trained: tests/cli/test_es.py passes
`--reward_funcs scripts.counted_rewards.counted_digit_fraction`.
"""

from trl_es.testing import digit_fraction

# The number of completions of each call, in order.
calls: list[int] = []


def counted_digit_fraction(completions, **kwargs):
    calls.append(len(completions))
    return digit_fraction(completions)
