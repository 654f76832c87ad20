"""Run a SequentialTrainer of one-step stages on the tiny model under whatever `accelerate launch` set up.

    accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml --num_processes 2 \
        train_sequence.py MODEL OUTPUT_DIR es,grpo [--use_vllm]

With --use_vllm every stage generates with its own colocated vLLM engine, one per process.
"""

import argparse
import os

from accelerate import PartialState
from fast_es import MOVING, fast_es_config, fast_grpo_config
from threads import gloo_threads

from trl_es.sequential.trainer import SequentialTrainer
from trl_es.testing import digit_fraction, digit_prompts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("output_dir")
    parser.add_argument("methods", help="Comma-separated stage methods, e.g. es,grpo.")
    parser.add_argument("--use_vllm", action="store_true")
    cli = parser.parse_args()

    generation = dict(use_vllm=True, vllm_mode="colocate") if cli.use_vllm else {}
    common = dict(max_steps=1, per_device_train_batch_size=2, **generation)
    configs = {
        "es": lambda: fast_es_config(cli.output_dir, **common, **MOVING),
        "grpo": lambda: fast_grpo_config(cli.output_dir, **common),
    }
    sequence = SequentialTrainer(
        model=cli.model,
        stages=[configs[method]() for method in cli.methods.split(",")],
        output_dir=f"{cli.output_dir}/run",
        reward_funcs=digit_fraction,
        train_dataset=digit_prompts(8),
    )
    final = sequence.train()
    state = PartialState()
    print(f"SEQUENCE DONE {final} processes={state.num_processes}")
    # Leave together and tear the process group down: a rank that exits while gloo threads still run aborts.
    state.wait_for_everyone()
    state.destroy_process_group()
    print(f"GLOO THREADS LEFT {gloo_threads()}")


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    main()
