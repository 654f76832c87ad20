"""Train one step of GRPO or ES on the tiny model under whatever `accelerate launch` set up (DeepSpeed in the tests).

    accelerate launch --config_file examples/accelerate_configs/deepspeed_zero2.yaml --num_processes 2 \
        train_under_deepspeed.py MODEL OUTPUT_DIR grpo|es
"""

import gc
import sys

from datasets import Dataset
from threads import gloo_threads
from trl import GRPOConfig, GRPOTrainer

from trl_es import ESConfig, ESTrainer
from trl_es.compat.deepspeed import release_process_groups


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def main():
    model, output_dir, method = sys.argv[1:4]
    common = dict(output_dir=output_dir, per_device_train_batch_size=2, max_completion_length=6, max_steps=1,
                  report_to=[], save_strategy="no", use_cpu=True, bf16=False)  # fmt: skip
    dataset = Dataset.from_dict({"prompt": [f"Item {k}:" for k in range(8)]})
    if method == "grpo":
        trainer = GRPOTrainer(model=model, reward_funcs=length_reward, train_dataset=dataset,
                              args=GRPOConfig(num_generations=2, **common))  # fmt: skip
    else:
        trainer = ESTrainer(model=model, reward_funcs=length_reward, train_dataset=dataset,
                            args=ESConfig(population_size=2, **common))  # fmt: skip
    trainer.train()
    print(f"TRAINED {method} steps={trainer.state.global_step} processes={trainer.accelerator.num_processes}")
    # A DeepSpeed engine, and DeepSpeed's references to the process groups, would keep their gloo threads running at
    # exit: let go of both, as the SequentialTrainer does after each stage.
    state = trainer.accelerator.state
    trainer.accelerator.free_memory()
    del trainer
    gc.collect()
    release_process_groups()
    state.wait_for_everyone()  # a rank that exits while another still runs a collective aborts
    state.destroy_process_group()
    print(f"GLOO THREADS LEFT {gloo_threads()}")


if __name__ == "__main__":
    main()
