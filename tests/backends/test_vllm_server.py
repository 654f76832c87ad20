"""ESTrainer against a real `trl-es vllm-serve` server (mutually authenticated control channel, ES worker extension),
no weight traffic. One server serves the module; the tests that restart or kill it come last, and any test after them
gets it back (`Server.ensure_running`). Attacks are made as another local process would make them: an impostor
listening on the port first, replayed requests, another holder of the secret."""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests
import torch
from scripts.server_vllm_required import require_module

require_module("vllm")

from scripts.fast_es import MOVING, fast_es_config  # noqa: E402
from scripts.ragged_rows import generated_alone, ragged_rows  # noqa: E402
from scripts.vllm_servers import Server, serve_command, wait_healthy  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import trl_es  # noqa: E402
from benchmarks.harness import free_port  # noqa: E402
from trl_es import ESTrainer  # noqa: E402
from trl_es.backends.control_channel import (  # noqa: E402
    CHECKPOINT_DIR_ENV,
    CONTROL_PATH,
    HELLO,
    SIGNATURE_HEADER,
    write_new_secret,
)
from trl_es.backends.control_client import ControlSession  # noqa: E402
from trl_es.backends.sampling import SamplingSettings  # noqa: E402
from trl_es.backends.vllm_server import (  # noqa: E402
    VLLMServerBackend,
    VLLMServerError,
    VLLMServerNotProven,
    VLLMServerRestarted,
    VLLMServerStopped,
    VLLMServerTakenOver,
)
from trl_es.core.consistency import master_digest  # noqa: E402
from trl_es.core.master import MasterWeights  # noqa: E402
from trl_es.evaluation.coverage import BackendSampler  # noqa: E402
from trl_es.testing import digit_fraction, digit_prompts  # noqa: E402
from trl_es.trainer.callbacks import sampler_for  # noqa: E402

pytestmark = pytest.mark.vllm


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


def unsigned_control(port, method, *args, headers=None):
    """A control call made outside any session, as any local process could make it."""
    url = f"http://127.0.0.1:{port}{CONTROL_PATH}{method}"
    return requests.post(url, json={"args": [str(arg) for arg in args]}, headers=headers or {}, timeout=60)


def secret_holder(port, secret_file) -> ControlSession:
    """Another process that holds the server's secret, in a session of its own."""
    session = ControlSession(f"http://127.0.0.1:{port}", Path(secret_file).read_text().strip(), timeout=60)
    session.open()
    return session


def control(session: ControlSession, method, *args):
    """A control call in `session`; returns the (signed) answer whatever its status."""
    return session.request("POST", f"{CONTROL_PATH}{method}", {"args": [str(arg) for arg in args]})


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
    assert all(h["es/time/check"] > 0 for h in trainer.state.log_history if "reward" in h)  # a check every step
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
    assert unsigned_control(server_port, "es_version").status_code == 401
    bearer = {"Authorization": f"Bearer {secret}"}  # the secret itself opens nothing: it is never sent
    assert unsigned_control(server_port, "es_version", headers=bearer).status_code == 401
    holder = secret_holder(server_port, secret_file)
    assert control(holder, "es_version").json()["results"] == [trl_es.__version__]
    # Even with the secret, only the ES methods run: nothing that writes files or resets the engine.
    for method in ("reset_weights", "save_sharded_state", "collective_rpc"):
        assert control(holder, method).status_code == 400
    # The secret is on no command line of the server's processes (`ps` shows those to every user).
    group = [pid for pid in os.listdir("/proc") if pid.isdigit() and _in_group(int(pid), server.process.pid)]
    assert group and not any(secret.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in group)
    # The generation endpoints stay as they are.
    completion = {"model": requests.get(f"http://127.0.0.1:{server_port}/v1/models").json()["data"][0]["id"],
                  "prompt": "Item 1:", "max_tokens": 2}  # fmt: skip
    assert requests.post(f"http://127.0.0.1:{server_port}/v1/completions", json=completion).ok


def test_a_request_replayed_or_altered_is_refused_and_answers_are_signed(server_port, secret_file, monkeypatch):
    """Issue 27: every request of a session is signed with a counter used once; the server signs its answers."""
    holder = secret_holder(server_port, secret_file)
    sent = []
    request = holder.http.request

    def recording(method, url, **kwargs):
        sent.append((method, url, kwargs))
        return request(method, url, **kwargs)

    monkeypatch.setattr(holder.http, "request", recording)
    answer = control(holder, "es_version")
    assert answer.ok and SIGNATURE_HEADER in answer.headers
    method, url, kwargs = sent[0]
    replayed = requests.request(method, url, **kwargs)
    assert replayed.status_code == 401 and "used already" in replayed.json()["message"]
    altered = dict(kwargs, data=kwargs["data"].replace(b"[]", b'["x"]'), headers=dict(kwargs["headers"]))
    altered["headers"]["x-trl-es-counter"] = "1000"  # a fresh counter does not make another body valid
    assert requests.request(method, url, **altered).status_code == 401
    refusals = [replayed.text, requests.request(method, url, **altered).text]
    assert not any(SIGNATURE_HEADER in response.headers for response in (replayed,))  # refusals are not signed
    assert all("load" not in text and "run" not in text.lower() for text in refusals)  # and reveal no state
    assert control(holder, "es_version").ok  # the session itself goes on


def test_an_impostor_listening_on_the_port_first_gets_no_secret_and_is_refused(tmp_path, tiny_model_path, server_port,
                                                                                  secret_file):  # fmt: skip
    """Issue 27: another local user listening on the port before the server received the secret in the trainer's
    first request, served the public model's weights and chose every completion the trainer scored. Here the
    impostor even answers the handshake with a real answer of the server, recorded earlier."""
    recorded = requests.post(
        f"http://127.0.0.1:{server_port}{CONTROL_PATH}{HELLO}", json={"client_nonce": "00" * 32}, timeout=60
    ).json()
    port, log = free_port(), tmp_path / "impostor.log"
    impostor = subprocess.Popen([sys.executable, str(Path(__file__).parent.parent / "scripts" / "impostor_server.py"),
                                 str(port), str(log), json.dumps(recorded)])  # fmt: skip
    try:
        wait_healthy(impostor, port, log)
        trainer = make_trainer(tiny_model_path, server_config(tmp_path, port, secret_file))
        with pytest.raises(VLLMServerNotProven, match=rf"could not prove that it holds the control secret from "
                           rf"{secret_file}.*another process answers on port {port}"):  # fmt: skip
            trainer.train()
    finally:
        impostor.kill()
        impostor.wait(timeout=60)
    received = log.read_bytes()
    secret = Path(secret_file).read_text().strip().encode()
    assert b"/trl_es/v2/hello" in received  # it was asked to prove the secret, and nothing else
    assert secret not in received and b"/v1/completions" not in received and b"es_init" not in received


def _in_group(pid: int, group: int) -> bool:
    try:
        return os.getpgid(pid) == group
    except ProcessLookupError:
        return False


def test_a_trainer_with_another_secret_is_refused(tmp_path, tiny_model_path, server_port):
    wrong = tmp_path / "wrong.secret"
    write_new_secret(wrong)
    trainer = make_trainer(tiny_model_path, server_config(tmp_path, server_port, str(wrong)))
    refusal = f"could not prove that it holds the control secret from {wrong}.*Either the secret is not this server's"
    with pytest.raises(VLLMServerNotProven, match=refusal):
        trainer.train()


def test_another_holder_of_the_secret_can_neither_reset_nor_load_into_a_run(tmp_path, tiny_model_path, server_port,
                                                                             secret_file):  # fmt: skip
    """Issue 27: refusals echoed the run id and load number, `es_init` with the same run id reset the server's master,
    and loads brought the counter back in line: the run finished without error, with other final weights. Now a run
    answers only its own session; the run attacked mid-step ends bitwise as the run left alone."""
    left_alone = make_trainer(tiny_model_path, server_config(tmp_path / "alone", server_port, secret_file))
    left_alone.train()
    refusals = []

    def attack():
        backend = attacked.population.backend
        holder = secret_holder(server_port, secret_file)
        names = json.dumps(list(backend.master.tensors))
        refusals.append(control(holder, "es_init", backend.run_id, names, "float32", "0.05"))
        for method, args in [("es_load_center", [backend.load]), ("es_load_member", [backend.load, 7, 1, "0.05"]),
                             ("es_apply_update", ['{"7": 1.0}', "1.0", "0.0"]), ("es_verify", [backend.load]),
                             ("es_checksum", [backend.load])]:  # fmt: skip
            refusals.append(control(holder, method, backend.run_id, *args))

    config = server_config(tmp_path / "attacked", server_port, secret_file)
    attacked = make_trainer(tiny_model_path, config, reward=interrupt_at_step(1, attack))
    attacked.train()
    assert [answer.status_code for answer in refusals] == [400] + [409] * 5
    assert "starts one run only" in refusals[0].json()["message"]
    for answer in refusals[1:]:  # a refusal names no load number, and no run but the one asked for
        message = answer.json()["message"]
        assert message == f"This session holds no run {attacked.population.backend.run_id!r} in this server."
    expected = master_digest(left_alone.population.master.tensors)
    assert master_digest(attacked.population.master.tensors) == expected
    backend = attacked.population.backend
    assert backend._control("es_checksum", backend.run_id, backend.load)[0]["master_digest"] == expected


def test_a_run_started_by_another_holder_of_the_secret_during_a_members_generation_is_caught(
    tmp_path, tiny_model_path, server_port, secret_file, monkeypatch
):
    """The one thing another holder of the secret can do to a run is to replace it by a run of its own, which changes
    the engine's weights: the member whose generation saw them never reaches an update."""
    trainer = make_trainer(tiny_model_path, server_config(tmp_path, server_port, secret_file))
    completions, lock = [], threading.Lock()
    request = VLLMServerBackend._request

    def take_over_while_generating(backend, method, path, payload=None):
        # The third member's second completion request: its generation is under way.
        with lock:
            completions.append(path)
            if path == "/v1/completions" and completions.count(path) == 2 * 8 + 2:
                holder = secret_holder(server_port, secret_file)
                names = json.dumps(list(backend.master.tensors))
                assert control(holder, "es_init", "another-run", names, "float32", "0.05").ok
        return request(backend, method, path, payload)

    monkeypatch.setattr(VLLMServerBackend, "_request", take_over_while_generating)
    with pytest.raises(VLLMServerTakenOver, match=r"taken over by another trainer: Run [0-9a-f]+ was replaced"):
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
    load = worker.es_init("session", "run", names, "float32", "0.05")["result"]["load"]
    load = worker.es_load_member("session", "run", load, "7", "1", "0.05")["result"]
    assert worker.es_verify("session", "run", load) == {"result": None}
    original = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    worker.model_runner.model.hf.load_state_dict(original)  # an engine-side reset to the checkpoint's weights
    refusal = worker.es_verify("session", "run", load)
    assert refusal["error"] == "weights_changed" and "without any control call" in refusal["message"]


def test_a_run_id_starts_once_and_the_load_counter_never_goes_back(tiny_model_path):
    """Issue 27: `es_init` with the run's id reset its master and its load counter to 0."""
    worker, names = standin_worker(tiny_model_path)
    first = worker.es_init("session", "run", names, "float32", "0.05")["result"]["load"]
    load = worker.es_load_member("session", "run", first, "7", "1", "0.05")["result"]
    for session in ("session", "another"):  # not even the session that started it
        refusal = worker.es_init(session, "run", names, "float32", "0.05")
        assert refusal["error"] == "bad_request" and "starts one run only" in refusal["message"]
    assert worker.es_verify("session", "run", load) == {"result": None}  # the run goes on untouched
    second = worker.es_init("another", "run-2", names, "float32", "0.05")["result"]["load"]
    assert int(first) < int(load) < int(second)  # a new run's loads continue the count
    refusal = worker.es_verify("session", "run", load)
    assert refusal["error"] == "run_replaced" and "replaced" in refusal["message"]  # told to the run's session only
    assert worker.es_verify("another", "run", load)["message"] == "This session holds no run 'run' in this server."


def test_the_worker_loads_each_member_at_the_sigma_the_trainer_sends(tiny_model_path):
    """A sigma schedule or the adaptive sigma changes sigma between steps: `es_load_member` carries the step's, and
    the engine holds `master + sign * sigma * eps` at that sigma, not at the one `es_init` was given."""
    from trl_es.core.noise import parameter_noise

    worker, names = standin_worker(tiny_model_path)
    load = worker.es_init("session", "run", names, "float32", "0.05")["result"]["load"]
    centre = {name: tensor.clone() for name, tensor in worker.model_runner.model.hf.named_parameters()}
    worker.es_load_member("session", "run", load, "7", "-1", "0.2")
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
        refusal = worker.es_init("session", "run", names, "float32", "0.05", hub_id)
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
    refusal = worker.es_init("session", "run", names, "float32", "0.05", str(checkpoint))
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


def test_server_rows_of_ragged_members_generate_what_each_member_generates_alone(tiny_model_path, server_port,
                                                                                secret_file):  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    backend = VLLMServerBackend(
        f"http://127.0.0.1:{server_port}", MasterWeights(dict(model.named_parameters()), 0.05), secret_file=secret_file
    )
    backend.start_run(parameter_dtype="float32")
    probe = [tokenizer(f"Item {k}:")["input_ids"] for k in range(400, 403)]
    sampled = SamplingSettings(max_tokens=6, temperature=1.0)
    centre = backend.generate_center(probe, sampled, 11)
    rows = ragged_rows(lambda text: tokenizer(text)["input_ids"])
    for sampling in (sampled.with_(temperature=0.0), sampled):
        together = backend.generate_rows(rows, sampling)
        assert together == generated_alone(backend, rows, sampling), sampling.temperature
    as_centre = backend.generate_rows([dataclasses.replace(row, member=None) for row in rows], sampled)
    assert as_centre != together  # the members really generate differently
    assert backend.generate_center(probe, sampled, 11) == centre
    backend.check_consistency(step=0)  # the server holds its master's centre again


def test_a_server_taken_over_by_another_run_is_a_clear_error(tmp_path, tiny_model_path, server_port, secret_file):
    second = make_trainer(tiny_model_path, server_config(tmp_path / "second", server_port, secret_file, max_steps=1))
    # The second trainer starts and trains while the first is in the middle of its second step.
    first_reward = interrupt_at_step(1, second.train)
    first_config = server_config(tmp_path / "first", server_port, secret_file)
    first = make_trainer(tiny_model_path, first_config, reward=first_reward)
    with pytest.raises(VLLMServerTakenOver, match="taken over by another trainer: Run .* was replaced") as error:
        first.train()
    assert second.population.backend.run_id not in str(error.value)  # the other run's id is not given away
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
