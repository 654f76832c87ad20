"""GRPO's prompt sampler, made resumable: each epoch's shuffle is a function of (seed, epoch).

TRL's `RepeatSampler` draws every epoch's permutation from one generator seeded once, so a run resumed in epoch k
replays epoch 0's order instead of epoch k's. `set_epoch` is called as each epoch begins, also the epoch a resume
continues, on any number of processes (`TrainerHooks` sees to it, where the Trainer's own call cannot reach the
sampler), which is all this sampler needs to give the uninterrupted order.
"""

from __future__ import annotations

from trl.trainer.utils import RepeatSampler

from ..core.noise import derive_seed


class EpochSeededRepeatSampler(RepeatSampler):
    """[`~trl.trainer.utils.RepeatSampler`] whose shuffle depends only on the seed and the epoch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.set_epoch(0)

    @classmethod
    def like(cls, sampler: RepeatSampler) -> EpochSeededRepeatSampler:
        """The same sampling as `sampler` (the one `GRPOTrainer` builds), with epoch-seeded shuffles."""
        return cls(
            data_source=sampler.data_source,
            mini_repeat_count=sampler.mini_repeat_count,
            batch_size=sampler.batch_size,
            repeat_count=sampler.repeat_count,
            shuffle=sampler.shuffle,
            seed=sampler.seed,
        )

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle:
            self.generator.manual_seed(derive_seed(self.seed or 0, "epoch", epoch))
