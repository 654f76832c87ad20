"""The threads of this process that a torch.distributed gloo group runs (its workers and its transport loop), by the
names torch and gloo give them: none should outlive `destroy_process_group`."""

import os


def gloo_threads() -> list[str]:
    names = (open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task"))
    return [name for name in names if "gloo" in name]
