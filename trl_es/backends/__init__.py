"""How a population is evaluated: each backend writes a member's weights where generation reads them.

A backend has two methods: `load_member(member)` makes the next generation call use `master + sign * sigma * eps`,
and `load_center()` makes it use the master itself.
"""

from .hf import HFBackend

__all__ = ["HFBackend"]
