"""`trl-es vllm-serve` processes for tests: started on free ports, killed or restarted as a test needs (used by
tests/backends/test_vllm_server.py and tests/backends/test_vllm_server_pool.py)."""

import signal
from pathlib import Path

import pytest

from benchmarks import harness


def wait_healthy(process, port: int, log_path):
    """Until the server's `/health` answers (minutes on a loaded 2-core machine); the test fails if it never does."""
    try:
        harness.wait_healthy(process, port, log_path, seconds=600)
    except RuntimeError as error:
        pytest.fail(f"{error}\n(log: {log_path})")


class Server:
    """A server process started with `command(port)` on a free port, which a test may kill or restart on that port."""

    def __init__(self, command, log_dir: Path, environment=None):
        self.command, self.log_dir, self.environment = command, log_dir, environment
        self.port, self.process, self.starts = harness.free_port(), None, 0

    def start(self):
        self.launch()
        self.wait()

    def launch(self):
        """Start the process without waiting for it to serve (servers started together load their models at once)."""
        self.starts += 1
        self.log_path = self.log_dir / f"server-{self.starts}.log"
        self.process = harness.launch_server(self.command(self.port), self.log_path, self.environment)

    def wait(self):
        wait_healthy(self.process, self.port, self.log_path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self):
        """SIGKILL the whole server (API process, engine core, workers), as the OOM killer would."""
        harness.stop_server(self.process, signal.SIGKILL)

    def restart(self):
        self.kill()
        self.start()

    def ensure_running(self) -> int:
        if self.process.poll() is not None:
            self.start()
        return self.port

    def stop(self):
        harness.stop_server(self.process)


def serve_command(model_path, *flags):
    """`trl-es vllm-serve` as a user runs it (eager, as `harness.serve_command`), on the port a `Server` picks."""
    return lambda port: harness.serve_command(model_path, port, "--max_model_len", "256", *flags)
