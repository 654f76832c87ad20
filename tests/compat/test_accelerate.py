"""The Accelerate private that trl-es uses (through `trl_es.compat.accelerate`): a release that changes it fails here,
with the Accelerate version in the message."""

import accelerate
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState, PartialState

from trl_es.compat.accelerate import reset_accelerator_state

ACCELERATE = f"Accelerate {accelerate.__version__}"


def test_reset_accelerator_state_lets_the_next_accelerator_take_its_own_settings():
    Accelerator(cpu=True, gradient_accumulation_steps=3)
    assert GradientState().num_steps == 3
    try:
        reset_accelerator_state()
        assert AcceleratorState._shared_state == {}, f"{ACCELERATE}: AcceleratorState._reset_state kept the state"
        Accelerator(cpu=True, gradient_accumulation_steps=5)
        assert AcceleratorState().initialized and PartialState().initialized
    finally:
        reset_accelerator_state()
        GradientState._reset_state()
