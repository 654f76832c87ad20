"""Train ES on the tiny model with however many processes `accelerate launch` starts; write the final weights.

Used by tests/integration/test_multi_process.py and tests/integration/test_multi_node.py:
    accelerate launch --multi_gpu --num_processes P train_population.py MODEL OUTPUT_DIR --prompts_per_step B
(`--multi_gpu` starts P processes with torch.distributed; `use_cpu=True` in the config makes them CPU/gloo ranks.
`accelerate launch --cpu --num_processes P` starts a single process unless mpirun is set up.)
Each process gets B / P prompts from the dataloader, so every run sees B prompts per step. With --corrupt_rank R, that
rank's master is nudged after the first step, which the rank agreement check must catch; with --start_apart_rank R,
that rank's model is nudged before training, which the check at the start must catch. With --es_optimizer, each
rank writes how many elements of the optimizer state it holds (`optimizer_elements_rank<R>`; every rank also writes
the class of the model the Trainer trains, `wrapped_rank<R>`: DistributedDataParallel where Accelerate wrapped it, and
the elements of its evolving weights it holds as `train()` returns, `trained_model_elements_rank<R>`, and at the end,
`model_elements_rank<R>`; where processes release the model (vLLM engines or servers, several processes),
the evolving weights each rank holds once `restore_model_weights` gave back what it released,
`restored_rank<R>.safetensors`, and how many times the trainer gave them back before that, `given_back_rank<R>`);
--save_steps writes checkpoints (--save_on_each_node: the main process of each machine writes them), and --resume_from
continues one (each rank writes whether its model held the checkpoint's weights as training began, `loaded_rank<R>`);
--load_best evaluates and saves every step and loads the best checkpoint at the end (`load_best_model_at_end`). With
--vllm_servers URLS the members generate in `trl-es vllm-serve` servers (`vllm_mode="server"`, several URLs
comma-separated, shared out between the processes); --kill_server_group G makes the last rank SIGKILL process group G
during step 1 (after its generation, before its update).
"""

import argparse
import json
import os
import signal
from pathlib import Path

import torch
from fast_es import MOVING, fast_es_config
from safetensors.torch import load_file, save_file
from threads import gloo_threads
from transformers import TrainerCallback

from trl_es import ESTrainer
from trl_es.backends.population import evolving_parameters
from trl_es.core.released_weights import is_released
from trl_es.testing import digit_fraction, digit_prompts
from trl_es.trainer import released_model
from trl_es.trainer.released_model import releases_model, restore_model_weights
from trl_es.trainer.vllm_engine import release_vllm_engine

GIVEN_BACK = []  # each time the trainer gave this process back the weights it had released


def recording_restore(restore):
    """`released_weights.restore`, as the trainer calls it, noting in GIVEN_BACK when this process got weights back."""

    def recorded(parameters, *args, **kwargs):
        released = sum(map(is_released, parameters.values()))
        restore(parameters, *args, **kwargs)
        if sum(map(is_released, parameters.values())) < released:
            GIVEN_BACK.append(1)

    return recorded


released_model.restore = recording_restore(released_model.restore)


def killing_reward(trainer_box: list, process_group: int):
    """`digit_fraction`, except that the last rank kills `process_group` at its first call of step 1."""
    done = []

    def reward(completions, trainer_state, **kwargs):
        accelerator = trainer_box[0].accelerator
        if trainer_state.global_step == 1 and not done and accelerator.process_index == accelerator.num_processes - 1:
            done.append(True)
            os.killpg(process_group, signal.SIGKILL)
        return digit_fraction(completions)

    return reward


def evaluate(trainer, output_dir: str) -> None:
    """`trainer.evaluate` on 8 held-out prompts (each process gets its share), and, where the processes share an
    engine, whether each one's own rows generate as the same rows do among everyone's (rank_rows_rank<R>)."""
    metrics = trainer.evaluate(eval_dataset=digit_prompts(8, offset=100))
    rank = trainer.accelerator.process_index
    if trainer.accelerator.is_main_process:
        Path(output_dir, "eval.json").write_text(json.dumps(metrics))
    backend, sampling = trainer.population.backend, trainer.sampling
    everyone = [trainer.processing_class(f"Item {k}:")["input_ids"] for k in range(200, 204)]
    seeds = list(range(7, 11))
    together = backend.generate_loaded_rows(everyone, seeds, sampling)  # every process asks for the same rows
    mine = slice(2 * rank, 2 * rank + 2)  # then each for two of its own
    alone = backend.generate_loaded_rows(everyone[mine], seeds[mine], sampling)
    Path(output_dir, f"rank_rows_rank{rank}").write_text(str(alone == together[mine]))


class RecordResumedWeights(TrainerCallback):
    """As training begins (after a resume loaded what it loads, before the population is built), each rank writes
    whether its model holds the checkpoint's weights (`loaded_rank<R>`)."""

    def __init__(self, trainer, checkpoint: str, output_dir: str):
        self.trainer, self.checkpoint, self.output_dir = trainer, checkpoint, output_dir

    def on_train_begin(self, args, state, control, **kwargs):
        saved = load_file(Path(self.checkpoint) / "model.safetensors")
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        loaded = all(torch.equal(p, saved[name]) for name, p in evolving_parameters(model).items() if name in saved)
        Path(self.output_dir, f"loaded_rank{self.trainer.accelerator.process_index}").write_text(str(loaded))


class CorruptRank(TrainerCallback):
    def __init__(self, trainer, rank):
        self.trainer, self.rank = trainer, rank

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1 and self.trainer.accelerator.process_index == self.rank:
            next(iter(self.trainer.population.master.tensors.values())).view(-1)[0] += 1e-3


BEST = dict(eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1, load_best_model_at_end=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("output_dir")
    parser.add_argument("--prompts_per_step", type=int, default=8)
    parser.add_argument("--corrupt_rank", type=int, default=None)
    parser.add_argument("--start_apart_rank", type=int, default=None)
    parser.add_argument("--use_vllm", action="store_true", help="Generate with one colocated vLLM engine per process.")
    parser.add_argument("--tensor_parallel_size", type=int, default=1, help="With --use_vllm: processes per engine.")
    parser.add_argument("--es_optimizer", default="sgd")
    parser.add_argument("--dtype", default="float32", help="The model's dtype (bfloat16: a float32 master beside it).")
    parser.add_argument("--save_steps", type=int, default=None)
    parser.add_argument("--save_on_each_node", action="store_true", help="With --save_steps: a saver on each machine.")
    parser.add_argument("--resume_from", default=None)
    parser.add_argument("--vllm_servers", default=None, help="Generate in these trl-es vllm-serve servers.")
    parser.add_argument("--secret_file", default=None, help="The servers' control secret.")
    parser.add_argument("--kill_server_group", type=int, default=None)
    parser.add_argument("--evaluate", action="store_true", help="Evaluate after training; write eval.json.")
    parser.add_argument("--load_best", action="store_true", help="Evaluate and save every step; load the best at end.")
    cli = parser.parse_args()
    if cli.vllm_servers:
        server = dict(
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=cli.vllm_servers,
            vllm_server_secret_file=cli.secret_file,
            max_completion_length=8,
        )
    else:
        server = dict(use_vllm=cli.use_vllm, vllm_mode="colocate", vllm_tensor_parallel_size=cli.tensor_parallel_size)

    processes = int(os.environ.get("WORLD_SIZE", 1))  # read before the config creates the distributed state
    args = fast_es_config(
        cli.output_dir,
        per_device_train_batch_size=cli.prompts_per_step // processes,
        max_steps=3,
        **server,
        es_optimizer=cli.es_optimizer,
        model_init_kwargs={"dtype": cli.dtype},
        **({"save_strategy": "steps", "save_steps": cli.save_steps} if cli.save_steps else {}),
        save_on_each_node=cli.save_on_each_node,
        **(BEST if cli.load_best else {}),
        **({"eval_ks": [2]} if cli.evaluate else {}),  # coverage: its entropies run the model where it is held
        **MOVING,
    )
    trainer_box = []
    reward = digit_fraction if cli.kill_server_group is None else killing_reward(trainer_box, cli.kill_server_group)
    evaluation = digit_prompts(4, offset=100) if cli.load_best else None
    trainer = ESTrainer(
        model=cli.model, reward_funcs=reward, args=args, train_dataset=digit_prompts(16), eval_dataset=evaluation
    )
    trainer_box.append(trainer)
    if cli.corrupt_rank is not None:
        trainer.add_callback(CorruptRank(trainer, cli.corrupt_rank))
    if cli.resume_from:
        trainer.add_callback(RecordResumedWeights(trainer, cli.resume_from, cli.output_dir))
    if cli.start_apart_rank == trainer.accelerator.process_index:  # as a model built unseeded on each rank would
        with torch.no_grad():
            next(trainer.model.parameters()).view(-1)[0] += 1e-3
    trainer.train(resume_from_checkpoint=cli.resume_from)
    rank = trainer.accelerator.process_index
    model = trainer.accelerator.unwrap_model(trainer.model)
    held = sum(parameter.numel() for parameter in evolving_parameters(model).values())
    Path(cli.output_dir, f"trained_model_elements_rank{rank}").write_text(str(held))  # before a population is rebuilt
    held = sum(tensor.numel() for tensor in trainer.population.master.optimizer.state_dict().values())
    Path(cli.output_dir, f"optimizer_elements_rank{rank}").write_text(str(held))
    held = sum(tensor.numel() for tensor in trainer.population.master.tensors.values())
    Path(cli.output_dir, f"master_elements_rank{rank}").write_text(str(held))
    Path(cli.output_dir, f"wrapped_rank{rank}").write_text(type(trainer.model_wrapped).__name__)  # DDP's, or not
    rewards = [entry.get("reward") for entry in trainer.state.log_history]  # training's, before any evaluation
    if cli.evaluate:
        evaluate(trainer, cli.output_dir)
    held = sum(parameter.numel() for parameter in evolving_parameters(model).values())
    Path(cli.output_dir, f"model_elements_rank{rank}").write_text(str(held))  # 0 where a process released them
    # Collective: the processes of a tensor-parallel engine each hold a share of the master.
    master = trainer.population.master.full_state_dict(keep=trainer.accelerator.is_main_process)
    if trainer.accelerator.is_main_process:
        weights = {name: p.detach().contiguous() for name, p in trainer.model.named_parameters()}
        save_file(weights, f"{cli.output_dir}/final.safetensors")
        save_file({name: t.contiguous() for name, t in master.items()}, f"{cli.output_dir}/master.safetensors")
        torch.save(rewards, f"{cli.output_dir}/rewards.pt")
        Path(cli.output_dir, "num_processes").write_text(str(trainer.accelerator.num_processes))
    if releases_model(trainer.args):  # the processes that released the model's weights get them back (collective)
        Path(cli.output_dir, f"given_back_rank{rank}").write_text(str(len(GIVEN_BACK)))  # until now
        restore_model_weights(trainer)
        weights = {name: p.detach().contiguous() for name, p in evolving_parameters(model).items()}
        save_file(weights, f"{cli.output_dir}/restored_rank{rank}.safetensors")
    # Leave together and tear the process group down: a rank that exits while gloo threads still run aborts. A
    # colocated engine goes first (torn down later, it would destroy its groups after the default one is gone).
    release_vllm_engine(trainer)
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    Path(cli.output_dir, f"gloo_threads_rank{rank}").write_text(json.dumps(gloo_threads()))  # none should be left


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    main()
