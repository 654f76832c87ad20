"""The Accelerate private that trl-es uses (through `trl_es.compat.accelerate`): a release that changes it fails here,
with the Accelerate version in the message."""

import accelerate
import pytest
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState, PartialState
from torch import nn

from trl_es.compat.accelerate import prepare_without_ddp, reset_accelerator_state

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


def test_prepare_without_ddp_reaches_the_model_that_prepare_is_given():
    # On "meta" a move is an error, so the model left where it is shows that `prepare` went through the replacement.
    trained, other = nn.Linear(2, 2, device="meta"), nn.Linear(2, 2, device="meta")
    accelerator = Accelerator(cpu=True)
    try:
        prepare_without_ddp(accelerator, lambda module: module is trained, place=False)
        prepared = accelerator.prepare(trained)
        assert prepared is trained and trained.weight.device.type == "meta", (
            f"{ACCELERATE}: Accelerator.prepare no longer prepares a module through self.prepare_model"
        )
        assert trained in accelerator._models  # prepared, as the Trainer's model must be
        with pytest.raises(NotImplementedError, match="meta"):  # every other module is placed as before
            accelerator.prepare(other)
    finally:
        reset_accelerator_state()
        GradientState._reset_state()
