"""benchmarks/gpu_check.sh on CPU with tiny sizes: it installs what the Python lacks from the wheel folder into a
private directory, runs the benchmark and prints every RESULT key (null, with a reason, for sections not run)."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from scripts.paths import REPO

SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
REQUIRED_KEYS = [
    "overhead_ratio_es_over_generation",
    "overhead_ratio_es_over_generation_small_batch",
    "memory_ratio_es_over_grpo",
    "memory_ratio_es_over_grpo_fp32",
    "memory_ratio_lowrank_over_grpo",
    "lowrank_ratio_over_batched_generation",
    "vllm_overhead_ratio",
    "speedup_2_processes",
    "memory_bytes_per_param_es_colocate",
    "memory_bytes_per_param_es_colocate_compensated",
    "memory_bytes_per_param_es_colocate_offloaded",
    "speedup_2_servers",
    "tp2_over_tp1_step_time_ratio",
]


def _pure_python_wheel(folder: Path, name: str) -> Path:
    """A minimal wheel of module `name` (as the wheel folder would hold TRL's)."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    dist_info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", "FROM_WHEEL = True\n")
        wheel.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        wheel.writestr(
            f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{dist_info}/RECORD", "")
    return path


def _run(tmp_path, packages: str, *flags: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": sys.executable, "WHEELS": str(tmp_path), "GPU_CHECK_PACKAGES": packages,
                   "TMPDIR": str(tmp_path)}  # fmt: skip
    return subprocess.run(["bash", str(SCRIPT), *flags], capture_output=True, text=True, env=environment, timeout=600)


def test_gpu_check_installs_the_missing_wheels_and_prints_every_result_key_on_cpu(tmp_path):
    _pure_python_wheel(tmp_path, "trl_es_gpu_check_probe")
    run = _run(tmp_path, "trl:trl trl_es_gpu_check_probe:trl_es_gpu_check_probe", "--device", "cpu",
               "--preset", "tiny", "--sections", "speed")  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "installing trl_es_gpu_check_probe" in run.stdout  # trl imports already; the probe came from the wheel
    result = json.loads(run.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
    assert set(REQUIRED_KEYS) <= set(result)
    assert result["overhead_ratio_es_over_generation"] > 0
    assert result["overhead_ratio_es_over_generation_small_batch"] > 0
    assert result["memory_ratio_es_over_grpo"] is None
    assert result["skipped"]["memory"] == "not among --sections"
    assert not list(tmp_path.glob("trl-es-gpu-check-site.*"))  # the private directory is removed at the end


def test_gpu_check_stops_before_running_when_a_module_has_no_wheel(tmp_path):
    run = _run(tmp_path, "trl_es_module_nobody_has:trl_es_module_nobody_has", "--device", "cpu", "--preset", "tiny")
    assert run.returncode == 2
    assert "has no wheel of it" in run.stderr and "make gpu-wheels" in run.stderr
