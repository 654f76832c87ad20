"""`trl-es vllm-serve` processes for tests: started on free ports, killed or restarted as a test needs (used by
tests/backends/test_vllm_server.py and tests/backends/test_vllm_server_pool.py)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from benchmarks.harness import free_port


def wait_healthy(process, port: int, log_path):
    deadline = time.time() + 600  # minutes on a loaded 2-core machine
    while time.time() < deadline:
        if process.poll() is not None:
            pytest.fail(f"The server exited with {process.returncode}; see {log_path}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"The server did not become healthy in 600 s; see {log_path}")


class Server:
    """A server process started with `command(port)` on a free port, which a test may kill or restart on that port."""

    def __init__(self, command, log_dir: Path, environment=None):
        self.command, self.log_dir, self.environment = command, log_dir, environment
        self.port, self.process, self.starts = free_port(), None, 0

    def start(self):
        self.launch()
        self.wait()

    def launch(self):
        """Start the process without waiting for it to serve (servers started together load their models at once)."""
        self.starts += 1
        self.log_path = self.log_dir / f"server-{self.starts}.log"
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                self.command(self.port),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.environment,
            )

    def wait(self):
        wait_healthy(self.process, self.port, self.log_path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self):
        """SIGKILL the whole server (API process, engine core, workers), as the OOM killer would."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)

    def restart(self):
        self.kill()
        self.start()

    def ensure_running(self) -> int:
        if self.process.poll() is not None:
            self.start()
        return self.port

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=60)


def serve_command(model_path, *flags):
    """`trl-es vllm-serve` as a user runs it; eager mode, as compiling would double the start time on 2 cores."""
    return lambda port: [sys.executable, "-m", "trl_es.cli.main", "vllm-serve", "--model", model_path,
                         "--max_model_len", "256", "--port", str(port), *flags, "--", "--enforce-eager"]  # fmt: skip
