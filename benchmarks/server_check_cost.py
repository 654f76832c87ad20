"""What the server's weight-change check costs, measured on a real `trl-es vllm-serve` server.

Per member, the check fingerprints the engine twice: right after the member's load, and in `es_verify` after its
generation (one extra round trip). This script times, per member, the load (`es_load_member`), the generation with
its verification (`generate_center`), and `es_verify` alone, and prints the check's share:
`2 * verify / (load + generate)`, an upper bound (a verify call includes its round trip).

    .venv/bin/python benchmarks/server_check_cost.py --hidden_size 512 --layers 8 --rows 8 --tokens 32
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Run as a script, Python puts benchmarks/ on sys.path; the `benchmarks` package needs the repository root.
REPOSITORY = str(Path(__file__).resolve().parents[1])
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)

from benchmarks.harness import (  # noqa: E402
    free_port,
    launch_server,
    median,
    serve_command,
    stop_server,
    timed,
    wait_healthy,
)
from trl_es.backends.sampling import SamplingSettings  # noqa: E402
from trl_es.backends.vllm_server import VLLMServerBackend  # noqa: E402
from trl_es.core.master import MasterWeights  # noqa: E402
from trl_es.core.noise import Member  # noqa: E402
from trl_es.testing import build_tiny_qwen2, build_tiny_tokenizer  # noqa: E402


def start_server(model: Path, secret_file: Path, log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    flags = ["--secret_file", str(secret_file), "--max_model_len", "512"]
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    process = launch_server(serve_command(model, port, *flags), log, environment)
    wait_healthy(process, port, log)
    return process, port


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden_size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=8, help="prompts per member")
    parser.add_argument("--tokens", type=int, default=32, help="completion tokens per prompt")
    parser.add_argument("--members", type=int, default=4)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="trl-es-check-cost-"))
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_qwen2(tokenizer, hidden_size=args.hidden_size, num_hidden_layers=args.layers)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    parameters = sum(p.numel() for p in model.parameters())
    process, port = start_server(folder / "model", folder / "secret", folder / "server.log")
    try:
        master = MasterWeights(dict(model.named_parameters()), sigma=1e-3)
        backend = VLLMServerBackend(f"http://127.0.0.1:{port}", master, secret_file=str(folder / "secret"))
        backend.start_run("float32")
        prompts = [tokenizer(f"Item {k}:")["input_ids"] for k in range(args.rows)]
        sampling = SamplingSettings(max_tokens=args.tokens, temperature=1.0, extra={"ignore_eos": True})
        loads, generations, verifies = [], [], []
        for seed in range(args.members + 1):  # the first member warms up
            loads.append(timed(backend.load_member, Member(seed, 1)))
            generations.append(timed(backend.generate_center, prompts, sampling, seed))
            verifies.append(timed(backend._control, "es_verify", backend.run_id, backend.load))
        load, generate, verify = median(loads[1:]), median(generations[1:]), median(verifies[1:])
        print(f"model: {parameters / 1e6:.1f}M parameters; {args.rows} rows x {args.tokens} tokens per member")
        print(f"per member: load {load:.3f} s, generate+verify {generate:.3f} s, es_verify alone {verify:.3f} s")
        print(f"check / (load + generate) = {2 * verify / (load + generate - verify):.3f}")
    finally:
        stop_server(process)


if __name__ == "__main__":
    main()
