"""ES over several `trl-es vllm-serve` servers (issue 29): one process spreading its members over two servers, and two
training processes with a server each, end bitwise as one process with one server; a server killed mid-step is an
error naming it, and the run resumes bitwise from its last checkpoint; a server with a tensor-parallel engine splits
its master between its workers. Two servers serve the module, and a third with two workers."""

import os

import pytest
import torch
from safetensors.torch import load_file
from scripts.server_vllm_required import require_module

require_module("vllm")

from scripts.fast_es import MOVING, fast_es_config  # noqa: E402
from scripts.launch import launch  # noqa: E402
from scripts.ragged_rows import MEMBER_1, generated_alone, ragged_rows  # noqa: E402
from scripts.vllm_servers import Server, serve_command  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from trl_es import ESConfig, ESTrainer  # noqa: E402
from trl_es.backends.control_channel import write_new_secret  # noqa: E402
from trl_es.backends.sampling import SamplingSettings  # noqa: E402
from trl_es.backends.server_urls import check_server_urls, servers_of_process  # noqa: E402
from trl_es.backends.vllm_server import VLLMServerBackend  # noqa: E402
from trl_es.backends.vllm_server_pool import VLLMServerPool  # noqa: E402
from trl_es.core.master import MasterWeights  # noqa: E402
from trl_es.testing import digit_fraction, digit_prompts  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("secret") / "servers.secret")


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def servers(tiny_model_path, tmp_path_factory, secret_file, checkpoint_root):
    """Two servers sharing one secret file, started together."""
    write_new_secret(secret_file)
    flags = ["--secret_file", secret_file, "--checkpoint_dir", str(checkpoint_root)]
    first, second = (Server(serve_command(tiny_model_path, *flags), tmp_path_factory.mktemp("server")) for _ in "ab")
    for server in (first, second):
        server.launch()
    for server in (first, second):
        server.wait()
    yield first, second
    for server in (first, second):
        server.stop()


@pytest.fixture(scope="module")
def tensor_parallel_server(tiny_model_path, tmp_path_factory, secret_file, checkpoint_root, servers):
    """A server whose engine has two tensor-parallel workers (the secret file is the `servers`' one)."""
    flags = ["--secret_file", secret_file, "--checkpoint_dir", str(checkpoint_root), "--tensor_parallel_size", "2"]
    cores = sorted(os.sched_getaffinity(0))
    # vLLM-CPU binds each worker's threads to a NUMA node of its own, and this machine has one: bind them by hand.
    environment = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": f"{cores[0]}|{cores[-1]}"}
    server = Server(serve_command(tiny_model_path, *flags), tmp_path_factory.mktemp("tp-server"), environment)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def running(servers):
    for server in servers:
        server.ensure_running()
    return servers


@pytest.fixture(scope="module")
def one_server_run(tiny_model_path, servers, secret_file, checkpoint_root):
    """The reference: one process, the first server; its final master, per tensor."""
    output_dir = checkpoint_root / "one-server"
    run = launch(1, tiny_model_path, output_dir, "--vllm_servers", servers[0].url, "--secret_file", secret_file)
    assert run.returncode == 0, run.stderr[-3000:]
    return load_file(output_dir / "master.safetensors")


def assert_same_weights(expected: dict, actual: dict):
    assert expected.keys() == actual.keys()
    differing = [name for name in expected if not torch.equal(expected[name], actual[name])]
    assert not differing, differing


def test_each_process_drives_its_own_contiguous_share_of_the_listed_servers():
    urls = [f"http://127.0.0.1:{port}" for port in range(8000, 8004)]
    assert [servers_of_process(urls, rank, 2) for rank in (0, 1)] == [urls[:2], urls[2:]]
    assert [servers_of_process(urls, rank, 4) for rank in range(4)] == [[url] for url in urls]
    with pytest.raises(ValueError, match=r"3 vLLM server\(s\) for 2 training processes.*a multiple of 2"):
        check_server_urls(urls[:3], processes=2)
    with pytest.raises(ValueError, match="lists 'http://127.0.0.1:8000' more than once"):
        ESConfig(output_dir="unused", use_vllm=True, vllm_mode="server", vllm_server_base_url=f"{urls[0]}, {urls[0]}/")


def test_one_process_over_two_servers_ends_bitwise_as_over_one(tmp_path, tiny_model_path, running, secret_file,
                                                               one_server_run):  # fmt: skip
    both = ",".join(server.url for server in running)
    config = fast_es_config(tmp_path, **pool_settings(both, secret_file))
    trainer = ESTrainer(
        model=tiny_model_path, reward_funcs=digit_fraction, args=config, train_dataset=digit_prompts(16)
    )
    trainer.train()
    backend = trainer.population.backend
    assert isinstance(backend, VLLMServerPool) and [s.base_url for s in backend.servers] == both.split(",")
    assert_same_weights(
        one_server_run, {name: t.contiguous() for name, t in trainer.population.master.tensors.items()}
    )
    backend.check_consistency(step=trainer.state.global_step)  # both servers' masters are the trainer's


def pool_settings(urls: str, secret_file: str) -> dict:
    """As tests/scripts/train_population.py sets a server run (8 prompts a step, 3 steps)."""
    return dict(use_vllm=True, vllm_mode="server", vllm_server_base_url=urls, vllm_server_secret_file=secret_file,
                per_device_train_batch_size=8, max_completion_length=8, max_steps=3, **MOVING)  # fmt: skip


def test_two_processes_with_a_server_each_split_the_master_keep_one_model_and_end_bitwise_as_one_process_with_one(
    tiny_model_path, running, secret_file, checkpoint_root, one_server_run
):
    output_dir = checkpoint_root / "two-processes"
    urls = ",".join(server.url for server in running)
    run = launch(2, tiny_model_path, output_dir, "--vllm_servers", urls, "--secret_file", secret_file)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (output_dir / "num_processes").read_text() == "2"
    assert_same_weights(one_server_run, load_file(output_dir / "master.safetensors"))
    # The servers evaluate the members from the master: only the process that saves keeps the trainer's model, and
    # the other gets its final weights back from it when asked.
    total = sum(tensor.numel() for tensor in one_server_run.values())
    assert [int((output_dir / f"model_elements_rank{rank}").read_text()) for rank in (0, 1)] == [total, 0]
    # The servers keep masters of their own: the training processes split theirs, each tensor's on one of them.
    held = [int((output_dir / f"master_elements_rank{rank}").read_text()) for rank in (0, 1)]
    assert sum(held) == total and max(held) < 0.6 * total, (held, total)
    assert [(output_dir / f"given_back_rank{rank}").read_text() for rank in (0, 1)] == ["0", "0"]
    final = load_file(output_dir / "final.safetensors")
    for rank in (0, 1):
        restored = load_file(output_dir / f"restored_rank{rank}.safetensors")
        assert restored.keys() == final.keys() and all(torch.equal(restored[k], final[k]) for k in final)


def test_a_process_whose_share_of_the_split_master_diverged_stops_the_run_at_the_next_check(
    tiny_model_path, running, secret_file, checkpoint_root
):
    """Each tensor of the split master lives on one process, so the processes have none to compare with each other;
    the servers' masters are checked against the digest combined from every owner's share, which catches it."""
    output_dir = checkpoint_root / "diverged"
    urls = ",".join(server.url for server in running)
    run = launch(2, tiny_model_path, output_dir, "--vllm_servers", urls, "--secret_file", secret_file,
                 "--corrupt_rank", 1)  # fmt: skip
    assert run.returncode != 0
    assert "At step 2 the vLLM server's master differs from the trainer's" in run.stderr, run.stderr[-3000:]
    assert "where the training processes split the master, one process's share" in run.stderr


def test_a_server_killed_mid_step_is_an_error_naming_it_and_the_run_resumes_bitwise(
    tiny_model_path, running, secret_file, checkpoint_root, one_server_run
):
    output_dir = checkpoint_root / "killed"
    first, second = running
    urls = ",".join(server.url for server in running)
    common = ["--vllm_servers", urls, "--secret_file", secret_file, "--save_steps", "1"]
    killed = launch(2, tiny_model_path, output_dir, *common, "--kill_server_group", os.getpgid(second.process.pid))
    assert killed.returncode != 0
    assert f"VLLMServerStopped: The vLLM server at {second.url} stopped answering during the run" in killed.stderr
    assert (output_dir / "checkpoint-1").is_dir() and not (output_dir / "checkpoint-2").exists()

    second.start()  # the same port and secret file; the run's master in it is rebuilt from the checkpoint
    resumed = launch(2, tiny_model_path, output_dir, *common, "--resume_from", output_dir / "checkpoint-1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_weights(one_server_run, load_file(output_dir / "master.safetensors"))
    # The process that releases the model reads its master from the checkpoint's files instead of loading them.
    assert [(output_dir / f"loaded_rank{rank}").read_text() for rank in (0, 1)] == ["True", "False"]


def test_rows_spread_over_two_servers_are_what_each_member_generates_alone(tiny_model_path, running, secret_file):
    """`generate_rows` puts each member's rows on one server (member 0 and 1 on the first, the centre on the second),
    `generate_center` spreads the rows over both; a member held in place (`member_loaded`, a rollout function's turns)
    is held by every server."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    servers = [VLLMServerBackend(server.url, MasterWeights(dict(model.named_parameters()), 0.05),
                                 secret_file=secret_file) for server in running]  # fmt: skip
    pool = VLLMServerPool(servers)
    for server in servers:
        server.start_run(parameter_dtype="float32")
    rows = ragged_rows(lambda text: tokenizer(text)["input_ids"])
    sampling = SamplingSettings(max_tokens=6, temperature=1.0)
    assert pool.generate_rows(rows, sampling) == generated_alone(pool, rows, sampling)

    probe = [tokenizer(f"Item {k}:")["input_ids"] for k in range(400, 405)]
    [member_alone] = pool.generate([MEMBER_1], probe, sampling, 11)  # on the first server
    with pool.member_loaded(MEMBER_1):
        assert (
            pool.generate_center(probe, sampling, 11) == member_alone
        )  # rows 0, 2, 4 on the first, 1, 3 on the second
    assert pool.generate_center(probe, sampling, 11) != member_alone
    pool.check_consistency(step=0)  # every server holds the centre again


def test_a_tensor_parallel_server_splits_its_master_between_its_workers_and_trains_and_resumes_bitwise(
    tiny_model_path, tensor_parallel_server, secret_file, checkpoint_root, one_server_run
):
    """Each worker of a TP=2 server keeps about half of the float32 master (a 70B model's whole master would be 280 GB
    on every GPU of the engine); the run and its resume through the server end bitwise as the run over a server with
    one worker, and every check compares the whole master's digest, gathered from the owners."""
    output_dir = checkpoint_root / "tensor-parallel-server"  # under the server's --checkpoint_dir
    settings = pool_settings(tensor_parallel_server.url, secret_file) | dict(save_strategy="steps", save_steps=2)

    def trained(resume_from=None) -> ESTrainer:
        config = fast_es_config(output_dir, **settings)
        trainer = ESTrainer(model=tiny_model_path, reward_funcs=digit_fraction, args=config,
                            train_dataset=digit_prompts(16))  # fmt: skip
        trainer.train(resume_from_checkpoint=resume_from)
        assert_same_weights(one_server_run, {n: t.contiguous() for n, t in trainer.population.master.tensors.items()})
        return trainer

    backend = trained().population.backend
    reports = backend._control("es_checksum", backend.run_id, backend.load)  # one per worker
    total = sum(tensor.numel() for tensor in one_server_run.values())
    held = [report["master_elements"] for report in reports]
    assert len(held) == 2 and sum(held) == total and max(held) < 0.6 * total, (held, total)
    backend.check_consistency(step=3)  # both workers report the trainer's digests
    trained(resume_from=str(output_dir / "checkpoint-2"))  # each worker rebuilds its share from the checkpoint
