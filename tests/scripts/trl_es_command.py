"""The `trl-es` command as users run it, in a process of its own (used by tests/cli/test_main.py and
tests/integration/test_learning.py)."""

import os
import subprocess
import sys
from pathlib import Path

from scripts.paths import REPO


def run_trl_es(*argv: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m trl_es.cli.main *argv` in `cwd`, the repository importable from there; fails the test, with the end
    of its output, if the command fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "trl_es.cli.main", *argv]
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result
