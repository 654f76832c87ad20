"""What the processes of a tensor-parallel engine hold privately of the model and its master while they train.

Two gloo processes share an engine's float32 master (each owns half of the tensors) of a bf16 model that each loads
as ESTrainer does (`from_pretrained`: its weights are mapped from the checkpoint's files, shared by the processes
until written). Each applies two updates through `Population.apply_update`, which writes the centre into the model's
weights it keeps, and reports how much private memory (`Anonymous` in `/proc/self/smaps_rollup`: the pages of no
file, the written copies of the mapped weights among them) it added since before the model was loaded. Side by side
in one run: every process keeps the model (as before 2026-12-06), and the process that saves no checkpoint (rank 1)
releases it (`release_model_weights`). Then a resume: the process that does not save loads the
checkpoint's weights into its model first, as the Trainer does (before 2026-12-06), or only reads its share of the
float32 masters, and reports the most private memory it held. Then a coverage evaluation's entropies: the process
that does not save gets the weights back to measure its own completions and releases them again (before 2026-12-06),
or the process that keeps the model measures everyone's (`entropies_where_held`); each process reports the most
private memory it held. The engine is left out (it is the same in both). The
processes give their freed temporaries back to the system at once (`MALLOC_MMAP_THRESHOLD_`): glibc would keep some
of the update's in its heap, and the measure would be the allocator's:

    .venv/bin/python benchmarks/released_model_memory.py --hidden 1024 --layers 12

Linux only (it reads `/proc/self/smaps_rollup`).
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

# Run as a script, Python puts benchmarks/ on sys.path; the `benchmarks` package needs the repository root.
REPOSITORY = str(Path(__file__).resolve().parents[1])
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from benchmarks.harness import run_on_processes  # noqa: E402
from trl_es.backends.population import Population, evolving_parameters, release_model_weights  # noqa: E402
from trl_es.core.released_weights import release, restore  # noqa: E402
from trl_es.core.sharded_master import ShardedMasterWeights  # noqa: E402
from trl_es.core.tensor_files import TensorFiles  # noqa: E402
from trl_es.core.update_shards import EngineShards  # noqa: E402
from trl_es.evaluation.coverage import completion_entropy  # noqa: E402
from trl_es.evaluation.trainer_coverage import entropies_where_held  # noqa: E402

PROCESSES = 2
COEFFICIENTS = {1: 0.5, 2: -0.5}


class NoEngine:
    """Stands in for the engine, whose memory is not measured here: it takes the update and holds nothing."""

    def after_update(self, coefficients, lr, weight_decay) -> None:
        pass


def private_gb() -> float:
    """This process's anonymous memory, in GB."""
    line = next(line for line in Path("/proc/self/smaps_rollup").read_text().splitlines() if line.startswith("Anon"))
    return int(line.split()[1]) * 1024 / 1e9


def train(rank: int, world: int, folder: str, release: bool, results) -> None:
    before = private_gb()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    parameters = evolving_parameters(model)
    keeps_model = rank == 0 or not release  # rank 0 saves the checkpoints: it keeps the model
    shards = EngineShards(dist.group.WORLD, {name: p.shape for name, p in parameters.items()})
    master = ShardedMasterWeights(parameters, 0.01, shards, share_float32=keeps_model)
    population = Population(master, NoEngine(), parameters)
    if not keeps_model:
        release_model_weights(master, parameters)
    for _ in range(2):
        population.apply_update(COEFFICIENTS, lr=1e-3, weight_decay=0.0)
    results[rank] = private_gb() - before


def resume(rank: int, world: int, folder: str, load: bool, results) -> None:
    """Resume from `folder/checkpoint` as the processes of a tensor-parallel engine do; rank 1, which saves nothing,
    loads the checkpoint's weights into its model first (`load`, as the Trainer does) or not. Reports the most private
    memory rank 1 held at the end of each phase: the weights in place, the master share read, the model released."""
    before, held = private_gb(), []
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    checkpoint = Path(folder, "checkpoint")
    if rank == 0 or load:
        model.load_state_dict(load_file(checkpoint / "model.safetensors"), strict=False)
    held.append(private_gb() - before)
    parameters = evolving_parameters(model)
    shards = EngineShards(dist.group.WORLD, {name: p.shape for name, p in parameters.items()})
    master = ShardedMasterWeights(parameters, 0.01, shards, share_float32=False)
    master.load_saved(TensorFiles([checkpoint / "es_state" / "master.safetensors"]))  # its share of the masters
    held.append(private_gb() - before)
    if rank == 1:
        release_model_weights(master, parameters)
    held.append(private_gb() - before)
    results[rank] = max(held)


def evaluate(rank: int, world: int, folder: str, give_back: bool, results) -> None:
    """The entropies of a coverage evaluation's completions (4 prompts per process, 2 completions each) where rank 1
    released the model: it gets the weights back (`give_back`, as before) and measures its own, or rank 0 measures
    everyone's. Reports the most private memory each process held at the end of each phase."""
    from accelerate import PartialState

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    state = PartialState(cpu=True)  # joins the harness's group, for the trainer's gathers
    before, held = private_gb(), []
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    parameters = evolving_parameters(model)
    if rank == 1:
        release(parameters)
    indices = list(range(rank, 4 * world, world))
    prompts = [[(7 * index + k) % 1000 for k in range(24)] for index in indices]
    completions = [[[(11 * index + k) % 1000 for k in range(8)]] * 2 for index in indices]
    held.append(private_gb() - before)
    if give_back:
        restore(parameters, source=0, device=torch.device("cpu"))
        completion_entropy(model, prompts, completions)
        held.append(private_gb() - before)
        if rank == 1:
            release(parameters)
    else:
        entropies_where_held(model, indices, state)(prompts, completions)
        held.append(private_gb() - before)
    results[rank] = max(held)


def write_checkpoint(folder: str) -> None:
    """A checkpoint of the model in `folder`: its bf16 weights, moved, and their float32 masters."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    moved = {name: (p.detach().float() + 1e-3).contiguous() for name, p in model.named_parameters()}
    checkpoint = Path(folder, "checkpoint")
    (checkpoint / "es_state").mkdir(parents=True)
    save_file({name: t.bfloat16() for name, t in moved.items()}, checkpoint / "model.safetensors")
    save_file(moved, checkpoint / "es_state" / "master.safetensors")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()

    config = transformers.Qwen2Config(
        vocab_size=32000,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 256),
        tie_word_embeddings=False,
    )
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # read by glibc as the spawned processes start
    grown = {}
    with tempfile.TemporaryDirectory(prefix="trl-es-released-model-") as folder:
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model_gb = sum(p.numel() for p in model.parameters()) * 2 / 1e9
        model.save_pretrained(folder)
        del model
        print(f"model: bf16 {model_gb:.2f} GB, float32 master {2 * model_gb:.2f} GB in {PROCESSES} shares")
        print(f"{'the process that does not save':<34}{'private memory added per process (GB)':>40}")
        for release, label in ((False, "keeps the model"), (True, "releases the model")):
            results = run_on_processes(train, PROCESSES, folder, release)
            grown[release] = [results[rank] for rank in range(PROCESSES)]
            print(f"{label:<34}{', '.join(f'{value:.2f}' for value in grown[release]):>40}")
        write_checkpoint(folder)
        print(f"{'a resume, the process that does not save':<44}{'most private memory (GB)':>30}")
        for load, label in ((True, "loads the checkpoint's weights"), (False, "reads its share of the masters")):
            held = run_on_processes(resume, PROCESSES, folder, load)[1]
            grown[f"resume_{load}"] = held
            print(f"{label:<44}{held:>30.2f}")
        print(f"{'a coverage evaluation, the entropies':<44}{'most private memory per process (GB)':>38}")
        for give_back, label in ((True, "rank 1 gets the weights back"), (False, "rank 0 measures every rank's")):
            results = run_on_processes(evaluate, PROCESSES, folder, give_back)
            grown[f"evaluate_{give_back}"] = [results[rank] for rank in range(PROCESSES)]
            print(f"{label:<44}{', '.join(f'{value:.2f}' for value in grown[f'evaluate_{give_back}']):>38}")
    ratio = grown[True][1] / max(grown[False][1], 1e-9)
    resume_ratio = grown["resume_False"] / max(grown["resume_True"], 1e-9)
    evaluation_ratio = max(grown["evaluate_False"]) / max(max(grown["evaluate_True"]), 1e-9)
    print(f"released_model_evaluation_ratio (holders measure / weights given back, the most of any process): "
          f"{evaluation_ratio:.2f}")  # fmt: skip
    print(f"released_model_resume_ratio (reads its share / loads the weights): {resume_ratio:.2f}")
    print(f"released_model_memory_ratio (releases / keeps, the process that does not save): {ratio:.2f}")


if __name__ == "__main__":
    main()
