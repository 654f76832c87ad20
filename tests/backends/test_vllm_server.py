"""ESTrainer against a real `trl-es vllm-serve` server (authenticated control channel, ES worker extension), no weight
traffic. One server serves the module; the tests that restart or kill it come last, and any test after them gets it
back (`Server.ensure_running`)."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import torch
from scripts.server_vllm_required import require_module

require_module("vllm")

from scripts.fast_es import MOVING, fast_es_config  # noqa: E402

import trl_es  # noqa: E402
from trl_es import ESTrainer  # noqa: E402
from trl_es.backends.control_channel import CHECKPOINT_DIR_ENV, CONTROL_PATH, write_new_secret  # noqa: E402
from trl_es.backends.vllm_server import (  # noqa: E402
    VLLMServerBackend,
    VLLMServerError,
    VLLMServerRestarted,
    VLLMServerStopped,
    VLLMServerTakenOver,
    VLLMServerWeightsChanged,
)
from trl_es.core.consistency import master_digest  # noqa: E402
from trl_es.core.master import MasterWeights  # noqa: E402
from trl_es.evaluation.coverage import BackendSampler  # noqa: E402
from trl_es.testing import digit_fraction, digit_prompts  # noqa: E402
from trl_es.trainer.callbacks import sampler_for  # noqa: E402

pytestmark = pytest.mark.vllm


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
        self.starts += 1
        log_path = self.log_dir / f"server-{self.starts}.log"
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(
                self.command(self.port),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.environment,
            )
        wait_healthy(self.process, self.port, log_path)

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


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("secret") / "server.secret")


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory) -> Path:
    """The server's --checkpoint_dir: runs that resume through the server write their checkpoints here."""
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def server(tiny_model_path, tmp_path_factory, secret_file, checkpoint_root):
    flags = ["--secret_file", secret_file, "--checkpoint_dir", str(checkpoint_root)]
    server = Server(serve_command(tiny_model_path, *flags), tmp_path_factory.mktemp("server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def server_port(server) -> int:
    return server.ensure_running()


def server_config(output_dir, port, secret_file, **overrides):
    server = dict(use_vllm=True, vllm_mode="server", vllm_server_port=port, vllm_server_secret_file=secret_file)
    shape = dict(per_device_train_batch_size=8, max_completion_length=8, max_steps=3)
    return fast_es_config(output_dir, **{**server, **shape, **MOVING, **overrides})


def make_trainer(model_path, config, reward=digit_fraction):
    return ESTrainer(model=model_path, reward_funcs=reward, args=config, train_dataset=digit_prompts(16))


def control(port, method, *args, secret=None):
    """A raw control call, as any local process could make it."""
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    url = f"http://127.0.0.1:{port}{CONTROL_PATH}{method}"
    return requests.post(url, json={"args": [str(arg) for arg in args]}, headers=headers, timeout=60)


def interrupt_at_step(step: int, action):
    """A reward function that runs `action` once, at its first call of (0-based) step `step`: after that step's
    generation and before its update."""
    done = []

    def reward(completions, trainer_state, **kwargs):
        if trainer_state.global_step == step and not done:
            done.append(True)
            action()
        return digit_fraction(completions)

    return reward


def test_es_trains_against_the_server_and_both_masters_end_identical(tmp_path, tiny_model_path, server_port,
                                                                      secret_file):  # fmt: skip
    trainer = make_trainer(tiny_model_path, server_config(tmp_path, server_port, secret_file))
    trainer.train()
    assert trainer.state.global_step == 3
    assert all(h["es/fitness/std"] > 0 for h in trainer.state.log_history if "reward" in h)
    backend = trainer.population.backend
    [report] = backend._control("es_checksum", backend.run_id, backend.load)
    assert report["master_digest"] == master_digest(trainer.population.master.tensors)
    assert master_digest(trainer.population.master.tensors) != master_digest(trainer._reference)  # the run moved


def test_an_unreachable_server_is_a_clear_error(tmp_path, tiny_model_path, secret_file):
    trainer = make_trainer(tiny_model_path, server_config(tmp_path, free_port(), secret_file))
    with pytest.raises(
        VLLMServerError, match=r"No vLLM server answers at http://[0-9.]+:[0-9]+\. Start one with .trl-es vllm-serve"
    ):
        trainer.train()


def test_callers_without_the_secret_are_refused_and_vllm_dev_routes_do_not_exist(server, server_port, secret_file):
    secret = Path(secret_file).read_text().strip()
    assert Path(secret_file).stat().st_mode & 0o777 == 0o600
    for route in ("/collective_rpc", "/reset_prefix_cache", "/sleep", "/wake_up"):  # vLLM dev mode is off
        response = requests.post(f"http://127.0.0.1:{server_port}{route}", json={"method": "reset_weights"})
        assert response.status_code == 404, route
    assert control(server_port, "es_version").status_code == 401
    assert control(server_port, "es_version", secret=secret[:-1] + "x").status_code == 401
    assert control(server_port, "es_version", secret=secret).json()["results"] == [trl_es.__version__]
    # Even with the secret, only the ES methods run: nothing that writes files or resets the engine.
    for method in ("reset_weights", "save_sharded_state", "collective_rpc"):
        assert control(server_port, method, secret=secret).status_code == 400
    # The secret is on no command line of the server's processes (`ps` shows those to every user).
    group = [pid for pid in os.listdir("/proc") if pid.isdigit() and _in_group(int(pid), server.process.pid)]
    assert group and not any(secret.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in group)
    # The generation endpoints stay as they are.
    completion = {"model": requests.get(f"http://127.0.0.1:{server_port}/v1/models").json()["data"][0]["id"],
                  "prompt": "Item 1:", "max_tokens": 2}  # fmt: skip
    assert requests.post(f"http://127.0.0.1:{server_port}/v1/completions", json=completion).ok


def _in_group(pid: int, group: int) -> bool:
    try:
        return os.getpgid(pid) == group
    except ProcessLookupError:
        return False


def test_a_trainer_with_another_secret_is_refused(tmp_path, tiny_model_path, server_port):
    wrong = tmp_path / "wrong.secret"
    write_new_secret(wrong)
    trainer = make_trainer(tiny_model_path, server_config(tmp_path, server_port, str(wrong)))
    with pytest.raises(VLLMServerError, match=f"refused the control secret from {wrong}"):
        trainer.train()


def test_weights_rewritten_during_a_members_generation_are_caught(tmp_path, tiny_model_path, server_port,
                                                                   secret_file, monkeypatch):  # fmt: skip
    trainer = make_trainer(tiny_model_path, server_config(tmp_path, server_port, secret_file))
    secret = Path(secret_file).read_text().strip()
    completions, lock = [], threading.Lock()
    request = VLLMServerBackend._request

    def reset_while_generating(backend, method, path, payload=None):
        # The third member's second completion request: its generation is under way. Another holder of the secret
        # resets the engine to the centre, as vLLM's `reset_weights` did through /collective_rpc.
        with lock:
            completions.append(path)
            if path == "/v1/completions" and completions.count(path) == 2 * 8 + 2:
                assert control(server_port, "es_load_center", backend.run_id, backend.load, secret=secret).ok
        return request(backend, method, path, payload)

    monkeypatch.setattr(VLLMServerBackend, "_request", reset_while_generating)
    with pytest.raises(VLLMServerWeightsChanged, match=r"rewritten during the run.*holds load #\d+ \(the centre\)"):
        trainer.train()
    assert completions.count("/v1/completions") < 4 * 8  # stopped at the third member
    assert trainer.state.global_step == 0  # the member's fitness never reached an update
    assert master_digest(trainer.population.master.tensors) == master_digest(trainer._reference)


def standin_worker(model_path: str):
    """The worker extension on a stand-in for vLLM's worker holding the model (vLLM models load Hugging Face names
    through `load_weights`), and the names of its parameters as `es_init` takes them."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from trl_es.backends.vllm_worker import ESWorkerExtension

    class Engine(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hf = AutoModelForCausalLM.from_pretrained(model_path)

        def load_weights(self, weights):
            parameters = dict(self.hf.named_parameters())
            for name, tensor in weights:
                parameters[name].data.copy_(tensor)

    worker = ESWorkerExtension()
    worker.model_runner = SimpleNamespace(model=Engine())
    worker.vllm_config = SimpleNamespace(model_config=SimpleNamespace(model=model_path))
    return worker, json.dumps([name for name, _ in worker.model_runner.model.hf.named_parameters()])


def test_weights_changed_inside_the_engine_without_a_control_call_are_caught(tiny_model_path):
    """The worker extension's own check: no control call can change weights unseen (the test above), and neither can
    anything inside the engine."""
    from transformers import AutoModelForCausalLM

    worker, names = standin_worker(tiny_model_path)
    load = worker.es_init("run", names, "float32", "0.05")["result"]["load"]
    load = worker.es_load_member("run", load, "7", "1", "0.05")["result"]
    assert worker.es_verify("run", load) == {"result": None}
    original = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    worker.model_runner.model.hf.load_state_dict(original)  # an engine-side reset to the checkpoint's weights
    refusal = worker.es_verify("run", load)
    assert refusal["error"] == "weights_changed" and "without any control call" in refusal["message"]


def test_the_worker_loads_each_member_at_the_sigma_the_trainer_sends(tiny_model_path):
    """A sigma schedule or the adaptive sigma changes sigma between steps: `es_load_member` carries the step's, and
    the engine holds `master + sign * sigma * eps` at that sigma, not at the one `es_init` was given."""
    from trl_es.core.noise import parameter_noise

    worker, names = standin_worker(tiny_model_path)
    load = worker.es_init("run", names, "float32", "0.05")["result"]["load"]
    centre = {name: tensor.clone() for name, tensor in worker.model_runner.model.hf.named_parameters()}
    worker.es_load_member("run", load, "7", "-1", "0.2")
    for name, tensor in worker.model_runner.model.hf.named_parameters():
        expected = centre[name] - 0.2 * parameter_noise(7, name, tensor.shape)
        assert torch.allclose(tensor, expected, atol=1e-6), name


def test_resume_reads_checkpoints_only_under_the_servers_checkpoint_dir(tmp_path, tiny_model_path, server_port,
                                                                        secret_file, checkpoint_root):  # fmt: skip
    master = MasterWeights({"model.norm.weight": torch.ones(64)}, sigma=0.01)
    backend = VLLMServerBackend(f"http://127.0.0.1:{server_port}", master, secret_file=secret_file)
    escape = checkpoint_root / "escape"
    escape.symlink_to(tmp_path, target_is_directory=True)  # a link out of the tree is judged by where it leads
    for outside in (str(tmp_path), str(escape), "/etc", "some-org/some-model"):
        with pytest.raises(VLLMServerError, match=rf"resumes from .*{Path(outside).name}.*--checkpoint_dir"):
            backend.start_run("float32", checkpoint=outside)


def test_the_worker_resumes_from_no_hub_id_and_opens_no_connection(tiny_model_path, checkpoint_root, monkeypatch):
    """What reaches the server as `resume_from` is refused unless it is a folder under --checkpoint_dir: a Hub id
    (which `from_pretrained` would download) is refused before any file or socket is opened."""
    worker, names = standin_worker(tiny_model_path)
    monkeypatch.setenv(CHECKPOINT_DIR_ENV, str(checkpoint_root))
    connections = []
    monkeypatch.setattr(socket.socket, "connect", lambda sock, address: connections.append(address))
    for hub_id in ("some-org/some-model", "gpt2"):
        refusal = worker.es_init("run", names, "float32", "0.05", hub_id)
        assert refusal["error"] == "checkpoint_refused" and "never downloads" in refusal["message"], refusal
    assert connections == []


def test_a_file_link_in_the_checkpoint_dir_leading_out_of_it_is_refused(tmp_path, tiny_model_path, checkpoint_root,
                                                                         monkeypatch):  # fmt: skip
    """Issue 27: only the checkpoint folder's path was resolved, so `es_state/master.safetensors` linking to a file
    outside `--checkpoint_dir` was read."""
    worker, names = standin_worker(tiny_model_path)
    monkeypatch.setenv(CHECKPOINT_DIR_ENV, str(checkpoint_root))
    checkpoint = checkpoint_root / "linked" / "checkpoint-1"
    (checkpoint / "es_state").mkdir(parents=True)
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes(b"not the run's master")
    (checkpoint / "es_state" / "master.safetensors").symlink_to(outside)
    refusal = worker.es_init("run", names, "float32", "0.05", str(checkpoint))
    assert refusal["error"] == "checkpoint_refused", refusal
    assert (
        "master.safetensors" in refusal["message"] and "outside this server's --checkpoint_dir" in refusal["message"]
    )


@pytest.mark.slow
def test_a_plain_vllm_server_without_the_extension_is_refused(tmp_path, tiny_model_path):
    def command(port):
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model_path,
                "--max-model-len", "256", "--host", "127.0.0.1", "--port", str(port), "--enforce-eager"]  # fmt: skip

    plain = Server(command, tmp_path)
    plain.start()
    try:
        secret_file = str(tmp_path / "server.secret")
        write_new_secret(secret_file)  # what a trainer may hold, e.g. an earlier server's
        trainer = make_trainer(tiny_model_path, server_config(tmp_path, plain.port, secret_file))
        with pytest.raises(VLLMServerError, match="no trl-es control channel.*does not run the trl-es worker"):
            trainer.train()
    finally:
        plain.stop()


def test_a_server_with_other_weights_is_refused_at_start(tmp_path, peaked_model_path, server_port, secret_file):
    trainer = make_trainer(peaked_model_path, server_config(tmp_path, server_port, secret_file))
    with pytest.raises(VLLMServerError, match="starts from other weights than the trainer"):
        trainer.train()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_run_resumed_against_the_server_ends_like_an_uninterrupted_one(tiny_model_path, server_port, secret_file,
                                                                         checkpoint_root, optimizer):  # fmt: skip
    """The server rebuilds the master and the `es_optimizer` state from the checkpoint (the consistency check of
    every step compares both digests)."""
    settings = dict(es_optimizer=optimizer, learning_rate=1e-3 if optimizer == "adam" else MOVING["learning_rate"])
    first = checkpoint_root / optimizer
    uninterrupted = make_trainer(tiny_model_path, server_config(first / "a", server_port, secret_file, **settings))
    uninterrupted.train()
    expected = master_digest(uninterrupted.population.master.tensors)

    config = server_config(first / "b", server_port, secret_file, save_strategy="steps", save_steps=2, **settings)
    make_trainer(tiny_model_path, config).train()  # writes checkpoint-2 (and the final checkpoint-3)
    resumed = make_trainer(tiny_model_path, config)
    resumed.train(resume_from_checkpoint=f"{config.output_dir}/checkpoint-2")  # the server rebuilds from it
    assert master_digest(resumed.population.master.tensors) == expected
    backend = resumed.population.backend
    assert backend._control("es_checksum", backend.run_id, backend.load)[0]["master_digest"] == expected


def test_eval_ks_measures_the_centre_through_the_server(tmp_path, tiny_model_path, server_port, secret_file):
    config = server_config(tmp_path, server_port, secret_file, max_steps=1, eval_ks=[1, 2], max_completion_length=6)
    trainer = make_trainer(tiny_model_path, config)
    trainer.train()
    sampler = sampler_for(trainer)
    assert isinstance(sampler, BackendSampler)
    prompts = [trainer.processing_class(f"Item {k}:")["input_ids"] for k in range(300, 304)]
    assert sampler.sample(prompts, 2, 1.0, 6, seed=3) == sampler.sample(prompts, 2, 1.0, 6, seed=3)
    metrics = trainer.evaluate(eval_dataset=digit_prompts(4, offset=300))
    assert 0 <= metrics["eval_pass@1"] <= metrics["eval_pass@2"] <= 1 and metrics["eval_entropy"] > 0
    backend = trainer.population.backend
    [report] = backend._control("es_checksum", backend.run_id, backend.load)
    assert report["master_digest"] == master_digest(trainer.population.master.tensors)  # evaluation changed no weights


def test_a_server_taken_over_by_another_run_is_a_clear_error(tmp_path, tiny_model_path, server_port, secret_file):
    second = make_trainer(tiny_model_path, server_config(tmp_path / "second", server_port, secret_file, max_steps=1))
    # The second trainer starts and trains while the first is in the middle of its second step.
    first_reward = interrupt_at_step(1, second.train)
    first_config = server_config(tmp_path / "first", server_port, secret_file)
    first = make_trainer(tiny_model_path, first_config, reward=first_reward)
    with pytest.raises(VLLMServerTakenOver, match="taken over by another trainer: its run") as error:
        first.train()
    assert second.population.backend.run_id in str(error.value)  # names the run that took over
    assert second.state.global_step == 1  # the second run went on undisturbed
    assert first.state.global_step == 1  # the first made no update from the step that the takeover broke


@pytest.mark.slow
def test_a_server_restarted_mid_step_is_a_clear_error(tmp_path, tiny_model_path, server, server_port, secret_file):
    reward = interrupt_at_step(1, server.restart)  # the same command: same port, same secret file
    trainer = make_trainer(tiny_model_path, server_config(tmp_path, server_port, secret_file), reward=reward)
    with pytest.raises(VLLMServerRestarted, match=r"was restarted during the run \(server instance [0-9a-f]+ is now"):
        trainer.train()
    assert trainer.state.global_step == 1


@pytest.mark.slow
def test_a_server_killed_mid_step_is_a_clear_error(tmp_path, tiny_model_path, server, server_port, secret_file):
    reward = interrupt_at_step(1, server.kill)
    trainer = make_trainer(tiny_model_path, server_config(tmp_path, server_port, secret_file), reward=reward)
    with pytest.raises(VLLMServerStopped, match="stopped answering during the run .*it was killed or crashed"):
        trainer.train()
    assert trainer.state.global_step == 1
