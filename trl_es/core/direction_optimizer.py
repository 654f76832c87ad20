"""An optimizer on the ES direction: what the update adds is `lr` times the direction `g = sum_seed coef * eps(seed)`
(plain ES, `"sgd"`), its running mean (`"momentum"`), or Adam's `m_hat / (sqrt(v_hat) + eps)` (`"adam"`, the
EGGROLL code's choice), with decoupled weight decay as before.

The state (one or two float32 tensors per evolving tensor, and the number of updates for Adam's bias correction) is
part of the run: it is saved in every checkpoint (`core.checkpoint`) and a resume continues bitwise. It is a pure
function of the directions, so the vLLM server's master keeps an equal copy by applying the same updates. With
`shard_update` (`core.update_shards`), each tensor's owner draws its direction, transforms it with the state it alone
keeps for that tensor and broadcasts the step: each of P processes holds about 1/P of the state, and a checkpoint
gathers all of it.

Adam's step has entries of size about `lr` whatever the direction's scale, while plain ES's `lr * g` has entries of
about `lr / sqrt(N)` (z-scored fitness): the same `learning_rate` moves Adam's weights about `sqrt(N)` times further.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch

from .guards import check_finite_tensors
from .host_memory import host_copy
from .tensor_files import StoredTensors, shapes_and_dtypes

ES_OPTIMIZERS = ("sgd", "momentum", "adam")
# The state each optimizer keeps per evolving tensor, saved as "<tensor name>.<suffix>"
STATE_SUFFIXES = {"sgd": (), "momentum": ("momentum",), "adam": ("exp_avg", "exp_avg_sq")}


@dataclass(frozen=True)
class DirectionOptimizerSettings:
    """Which optimizer, with its constants (`ESConfig.es_optimizer`, `es_momentum`, `adam_beta1`, `adam_beta2`,
    `adam_epsilon`)."""

    name: str = "sgd"
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8

    def __post_init__(self):
        if self.name not in ES_OPTIMIZERS:
            raise ValueError(f"Unknown es_optimizer={self.name!r}; use one of {', '.join(ES_OPTIMIZERS)}.")
        for field_name, value in (
            ("es_momentum", self.momentum),
            ("adam_beta1", self.beta1),
            ("adam_beta2", self.beta2),
        ):
            if not (isinstance(value, (int, float)) and 0 <= value < 1):
                raise ValueError(f"{field_name} must be a number in [0, 1), got {value!r}. The usual value is 0.9.")
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"adam_epsilon must be a finite number > 0, got {self.epsilon!r}. The usual one is 1e-8.")


class DirectionOptimizer:
    """Turns each tensor's ES direction into its step (before `lr`), keeping the state that needs.

    Call `begin_update()` once per update, then `step(name, direction)` for each tensor of it (in any order).

    Args:
        settings (`DirectionOptimizerSettings`): which optimizer and its constants.
        offload (`bool`, *optional*, defaults to `False`): Keep the state in host memory (`ESConfig.offload_master`):
            each tensor's state is computed on the direction's device and written back.
    """

    def __init__(self, settings: DirectionOptimizerSettings = DirectionOptimizerSettings(), offload: bool = False):
        self.settings = settings
        self.offload = offload
        self.updates = 0  # updates begun, Adam's t
        self.state: dict[str, torch.Tensor] = {}  # "<tensor>.momentum" / ".exp_avg" / ".exp_avg_sq", float32

    def begin_update(self) -> None:
        self.updates += 1

    def step(self, name: str, direction: torch.Tensor) -> torch.Tensor:
        """The step of tensor `name` for this update, from its `direction` (float32; transformed in place)."""
        settings = self.settings
        keys = [f"{name}.{suffix}" for suffix in STATE_SUFFIXES[settings.name]]
        buffers = [self._buffer(key, direction) for key in keys]
        if settings.name == "sgd":
            return direction
        if settings.name == "momentum":
            (buffer,) = buffers
            buffer.mul_(settings.momentum).add_(direction)
            step = direction.copy_(buffer)
        else:
            exp_avg, exp_avg_sq = buffers
            exp_avg.lerp_(direction, 1 - settings.beta1)
            exp_avg_sq.mul_(settings.beta2).addcmul_(direction, direction, value=1 - settings.beta2)
            first_correction = 1 - settings.beta1**self.updates
            second_correction = 1 - settings.beta2**self.updates
            denominator = (exp_avg_sq / second_correction).sqrt_().add_(settings.epsilon)
            step = torch.div(exp_avg, first_correction, out=direction).div_(denominator)
        if self.offload:
            for key, buffer in zip(keys, buffers, strict=True):
                self.state[key].copy_(buffer)
        return step

    def _buffer(self, key: str, like: torch.Tensor) -> torch.Tensor:
        """The state tensor `key`, created as zeros at the first update; offloaded, a copy on `like`'s device."""
        if key not in self.state:
            zeros = torch.zeros_like(like, dtype=torch.float32)
            self.state[key] = host_copy(zeros) if self.offload else zeros
        return self.state[key].to(like.device, non_blocking=True, copy=self.offload)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state tensors by key (empty for `"sgd"`); `updates` is saved beside them (`metadata`)."""
        return self.state

    def metadata(self) -> dict:
        return {"es_optimizer": self.settings.name, "es_optimizer_updates": self.updates}

    def load_state_dict(
        self,
        tensors: Mapping[str, torch.Tensor],
        metadata: dict,
        shapes: dict[str, torch.Size],
        kept: Collection[str] | None = None,
    ) -> None:
        """Continue from a checkpoint's state: `tensors` and `metadata` as saved, `shapes` the evolving tensors' (a
        state for another optimizer or another model is refused, naming what differs). With `kept`, only the state
        of those tensors is read and kept (every key is still checked against `shapes`, from the file headers where
        `tensors` are [`StoredTensors`])."""
        saved = metadata.get("es_optimizer", "sgd")
        if saved != self.settings.name:
            raise ValueError(
                f"The checkpoint was written with es_optimizer={saved!r}, but this run uses "
                f"es_optimizer={self.settings.name!r}: its optimizer state does not apply. Resume with "
                f"es_optimizer={saved!r}, or start a new run from the checkpoint's weights."
            )
        updates = int(metadata.get("es_optimizer_updates", 0))
        suffixes = STATE_SUFFIXES[self.settings.name]
        expected = {f"{name}.{suffix}": shape for name, shape in shapes.items() for suffix in suffixes}
        if set(tensors) != set(expected) and (tensors or updates):
            missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
            raise ValueError(
                f"The checkpoint's es_optimizer state does not match the model: missing {missing[:5]}, unexpected "
                f"{unexpected[:5]}. Resume with the same model (and PEFT configuration) that wrote the checkpoint."
            )
        for key, (shape, dtype) in shapes_and_dtypes(tensors).items():
            if shape != expected[key] or dtype != torch.float32:
                raise ValueError(
                    f"The checkpoint's es_optimizer state {key!r} is a {dtype} tensor of shape {tuple(shape)}, but it "
                    f"must be float32 of shape {tuple(expected[key])}."
                )
        state = {key: tensors[key] for key in tensors if kept is None or key.rsplit(".", 1)[0] in kept}
        check_finite_tensors(state, "The saved es_optimizer state")
        # Tensors read from files are this state's own; others are the caller's, so they are copied.
        self.state = state if isinstance(tensors, StoredTensors) else {key: t.clone() for key, t in state.items()}
        self.updates = updates
