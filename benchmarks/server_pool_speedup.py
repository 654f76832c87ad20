"""ES steps per second with `vllm_mode="server"` over 2 `trl-es vllm-serve` servers against 1, side by side in one run.

    python benchmarks/server_pool_speedup.py                  # the tiny local model on CPU: a few minutes
    python benchmarks/server_pool_speedup.py --model PATH --population_size 8 --batch_size 64

Two servers of the same model start together and share one secret file. Each block trains a fresh trainer for
`--warmup` steps and `--steps` timed ones (the Trainer's `step_time`), over server A alone or over A and B (one
process spreads its members over its servers: member i on server i % 2, in parallel); the blocks alternate, 1 server
then 2, `--repetitions` times, so that both settings see the same machine load, and the medians make the ratio. Each
trainer takes server A over from the one before it, which has finished by then. On CPU each server's engine runs on
its own share of the cores (`--server_cores split`; vLLM's own binding, `auto`, puts every server's engine on the
same cores); on CUDA each server gets its own GPU. The last line is `RESULT <json>`.
"""

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Run as a script, Python puts benchmarks/ on sys.path; the `benchmarks` package needs the repository root.
REPOSITORY = str(Path(__file__).resolve().parents[1])
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)

from benchmarks.harness import (  # noqa: E402
    core_share,
    free_port,
    launch_server,
    median,
    print_result,
    serve_command,
    stop_server,
    wait_healthy,
)
from benchmarks.trainers import ES_PHASES, even_token_fraction, quiet  # noqa: E402

SERVER_START_SECONDS = 900  # two engines loading at once on a loaded 2-core machine take minutes


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="Model path (default: the tiny model, built locally).")
    parser.add_argument("--population_size", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=16, help="Prompts per ES step (B).")
    parser.add_argument("--max_completion_length", type=int, default=32, help="Tokens of every completion (T).")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed steps at the start of each block.")
    parser.add_argument("--steps", type=int, default=2, help="Timed steps per block.")
    parser.add_argument("--repetitions", type=int, default=2, help="Blocks of each setting, alternating.")
    parser.add_argument(
        "--server_cores",
        choices=["split", "auto"],
        default="split",
        help="CPU: `split` gives each server's engine its own share of this process's cores; `auto` leaves the "
        "binding to vLLM.",
    )
    parser.add_argument("--cuda", action="store_true", help="Servers on GPUs 0 and 1, the trainer on CUDA.")
    return parser.parse_args(argv)


def main():
    cli = parse_args()
    from trl_es.backends.control_channel import write_new_secret
    from trl_es.testing import PEAKED_INITIALIZER_RANGE, save_tiny_model

    workdir = Path(tempfile.mkdtemp(prefix="trl-es-servers-"))
    model = cli.model or str(save_tiny_model(workdir / "tiny", initializer_range=PEAKED_INITIALIZER_RANGE))
    secret_file = str(workdir / "servers.secret")
    write_new_secret(secret_file)  # before either server starts: both read this one
    servers = [launch_server_of_index(cli, model, secret_file, index, workdir) for index in range(2)]
    try:
        urls = [wait_healthy(*server, seconds=SERVER_START_SECONDS) for server in servers]
        blocks = {1: [], 2: []}
        for _ in range(cli.repetitions):
            for count in blocks:
                blocks[count].append(timed_block(cli, model, urls[:count], secret_file, workdir))
    finally:
        for process, _, _ in servers:
            stop_server(process)
        shutil.rmtree(workdir, ignore_errors=True)
    rows = [summary(count, measured) for count, measured in blocks.items()]
    speedup = rows[1]["steps_per_second"] / rows[0]["steps_per_second"]
    print_table(cli, model, rows, speedup)
    print_result({"benchmark": "server_pool_speedup", "model": model, "population_size": cli.population_size,
                  "batch_size": cli.batch_size, "max_completion_length": cli.max_completion_length,
                  "server_cores": "cuda" if cli.cuda else cli.server_cores, "load_average": os.getloadavg(),
                  "runs": rows, "speedup_2_servers": speedup})  # fmt: skip


def launch_server_of_index(cli, model: str, secret_file: str, index: int, workdir: Path):
    """Start server `index` (0: A, 1: B) on a free port without waiting for it; (process, port, log)."""
    port = free_port()
    flags = ["--secret_file", secret_file, "--max_model_len", "512"]
    if cli.cuda:
        flags += ["--gpu_memory_utilization", "0.6"]  # room for the trainer on GPU 0
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    if cli.cuda:
        environment["CUDA_VISIBLE_DEVICES"] = str(index)
    elif cli.server_cores == "split":
        environment["VLLM_CPU_OMP_THREADS_BIND"] = core_share(index, 2)
    log = workdir / f"server-{index}.log"
    return launch_server(serve_command(model, port, *flags), log, environment), port, log


def timed_block(cli, model: str, urls: list[str], secret_file: str, workdir: Path) -> dict:
    """A fresh trainer over `urls`: `--warmup` steps, then `--steps` timed ones; their seconds and ES phases."""
    from trl_es import ESConfig, ESTrainer
    from trl_es.testing import digit_prompts

    steps = cli.warmup + cli.steps
    tokens = cli.max_completion_length
    args = ESConfig(
        output_dir=tempfile.mkdtemp(prefix="run-", dir=workdir),
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=",".join(urls),
        vllm_server_secret_file=secret_file,
        population_size=cli.population_size,
        per_device_train_batch_size=cli.batch_size,
        max_completion_length=tokens,
        generation_kwargs={"min_tokens": tokens},  # equal work: no completion stops early
        temperature=1.0,
        sigma=0.05,
        learning_rate=0.01,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=not cli.cuda,
    )
    dataset = digit_prompts(cli.batch_size * steps)
    trainer = quiet(ESTrainer(model=model, reward_funcs=even_token_fraction, args=args, train_dataset=dataset))
    trainer.train()
    timed = [entry for entry in trainer.state.log_history if "step_time" in entry][cli.warmup :]
    return {"step_seconds": [entry["step_time"] for entry in timed],
            "phases": {phase: [entry[f"es/time/{phase}"] for entry in timed] for phase in ES_PHASES}}  # fmt: skip


def summary(servers: int, blocks: list[dict]) -> dict:
    """One setting's blocks: the median seconds per step over all of its timed steps, and each phase's median."""
    seconds = [step for block in blocks for step in block["step_seconds"]]
    phases = {phase: median([value for block in blocks for value in block["phases"][phase]]) for phase in ES_PHASES}
    return {"servers": servers, "step_seconds": seconds, "seconds_per_step": median(seconds),
            "steps_per_second": 1 / median(seconds), "phases": phases}  # fmt: skip


def print_table(cli, model: str, rows: list[dict], speedup: float) -> None:
    cores = "each server on its own GPU" if cli.cuda else f"server cores: {cli.server_cores}"
    print(f"model {model}; N={cli.population_size}, B={cli.batch_size}, T={cli.max_completion_length}; "
          f"{cli.repetitions} blocks of {cli.steps} timed steps per setting, alternating; {cores}; load average "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'servers':>8s}{'s/step':>9s}{'steps/s':>9s}" + "".join(f"{phase:>10s}" for phase in ES_PHASES))
    for row in rows:
        print(f"{row['servers']:>8d}{row['seconds_per_step']:>9.3f}{row['steps_per_second']:>9.3f}"
              + "".join(f"{row['phases'][phase]:>10.3f}" for phase in ES_PHASES))  # fmt: skip
    print(f"speedup_2_servers = {speedup:.3f} (steps per second, 2 servers / 1)")


if __name__ == "__main__":
    main()
