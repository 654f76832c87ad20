"""How a population is evaluated: every backend implements `PopulationBackend` (`base.py`): it generates with each
member's weights, or the centre's, and follows the master's updates. `population.py` picks the backend for a
configuration, once."""

from .base import PhaseTimer, PopulationBackend
from .hf import HFBackend
from .population import Population, build_population

__all__ = ["HFBackend", "PhaseTimer", "Population", "PopulationBackend", "build_population"]
