"""Launching the scripts of tests/scripts/ as several processes with `accelerate launch` (used by
tests/integration/test_multi_process.py and tests/sequential/test_sequential_trainer.py)."""

import subprocess

from scripts.paths import ACCELERATE_CONFIGS, SCRIPTS

from benchmarks.harness import ACCELERATE_LAUNCH

TRAIN_POPULATION = SCRIPTS / "train_population.py"


def launch(processes: int, *args, script=TRAIN_POPULATION, config=None) -> subprocess.CompletedProcess:
    """`accelerate launch` with one of our configs. The scripts set `use_cpu=True`, so on a machine without GPUs the
    processes of multi_gpu.yaml become CPU ranks talking over gloo (accelerate's own `--cpu --num_processes 2`
    starts a single process unless mpirun is set up)."""
    config = config or ("single_gpu.yaml" if processes == 1 else "multi_gpu.yaml")
    config_file = ACCELERATE_CONFIGS / config
    command = [*ACCELERATE_LAUNCH, "--config_file", str(config_file), "--num_processes", str(processes)]
    return subprocess.run([*command, str(script), *map(str, args)], capture_output=True, text=True, timeout=600)
