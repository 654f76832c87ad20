"""ES vs GRPO memory, ES overhead over plain generation, and ES scaling, measured side by side in one run.

    python benchmarks/bench.py                  # quick: random ~30M Qwen2, N=4, B=4 (2 CPU cores: a few minutes)
    python benchmarks/bench.py --full           # larger model, population and batches, more repetitions
    python benchmarks/bench.py --memory_model 100M --population_size 8 --batch_size 8 --population_parallel

Everything runs offline on random Qwen2 models (byte-level BPE tokenizer trained locally, vocabulary 320, so the
transformer blocks hold almost all parameters), in float32, with sampling at temperature 1, the digit-fraction toy
reward and `min_new_tokens = max_completion_length`, so every completion has exactly that many tokens.

1. Memory. ES and GRPO each train `--steps` steps in a fresh subprocess on the same model, prompts and completion
   budget: ES with population N and B prompts per step, GRPO with B prompts and N completions per prompt (group size
   N), so both generate N x B completions per step. GRPO is TRL's GRPOTrainer with its defaults (AdamW, gradient
   checkpointing on, beta=0 so no reference model). Peak memory is measured from just before the model is loaded:
   `torch.cuda.max_memory_allocated` on CUDA; on CPU the process's peak RSS (VmHWM, reset after the model is loaded
   via /proc/self/clear_refs) minus the RSS before the model was loaded. "peak" includes the model's own weights
   (what a GPU user must fit); "added" is the peak minus the loaded model (what training adds on top).
   On CPU the workers run with glibc's `MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0`, so every tensor
   above 64 KiB is its own mapping, returned to the system when freed: RSS then follows live memory instead of what
   the allocator keeps cached. A first training step on a tiny model loads the libraries the trainers import lazily
   before the baseline is taken, so code pages do not count as training memory.
2. Speed, in one process, interleaved, medians. An ES step (HF backend) vs `model.generate` of the same N calls of
   B rows with the same seeds and fixed weights: `overhead_ratio_es_over_generation`. ES step vs GRPO step (TRL's
   training_step, i.e. generation, scoring, forward and backward, then gradient clipping and AdamW, as in the
   Trainer loop) on copies of the same model: `time_ratio_es_over_grpo_per_step` and `..._per_completion`.
3. Low-rank members. For N in `--lowrank_populations` (8 and 32): a full-rank ES step (members one after another),
   a low-rank ES step (`perturbation="lowrank"`: the population in one batched call) and `model.generate` of the same
   N x B rows in one call with fixed weights: `lowrank_ratio_es_over_generation_n<N>`.
4. vLLM: `benchmarks/vllm_es_overhead.py` (colocate, tiny model): `overhead_ratio_es_over_generation_vllm`.
5. Scale. ES seconds per step against population size, prompt batch and model size.

On CPU every process uses one torch thread unless `--threads` says otherwise: on a shared machine, OpenMP threads
that wait for each other while other processes hold the cores slowed generation 5-10x at random in our runs.

The last line is `RESULT <json>` with every ratio, the raw numbers and the machine.
"""

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# name -> (hidden size, layers); heads of 64 dims, a quarter of them for keys and values, MLP 3x hidden.
MODEL_SIZES = {"5M": (256, 6), "30M": (512, 10), "100M": (768, 14), "300M": (1024, 24)}
FULL = dict(
    memory_model="100M",
    population_size=8,
    batch_size=8,
    max_completion_length=32,
    steps=4,
    repetitions=5,
    scale_model="30M",
    populations=[4, 8, 16, 32],
    batch_sizes=[2, 4, 8, 16],
    model_sizes=["5M", "30M", "100M"],
)
WORKER_PREFIX = "WORKER "
SECTIONS = ["memory", "speed", "lowrank", "vllm", "scale"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help=f"Fuller defaults: {FULL}.")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--memory_model", choices=list(MODEL_SIZES), default="30M", help="Model of sections 1-2.")
    parser.add_argument("--population_size", type=int, default=4, help="N of sections 1-2 (GRPO: group size).")
    parser.add_argument("--batch_size", type=int, default=4, help="Prompts per step (B) of sections 1-2.")
    parser.add_argument("--max_completion_length", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2, help="Training steps per memory run (peak over all).")
    parser.add_argument("--repetitions", type=int, default=3, help="Timed repetitions in sections 2 and 3.")
    parser.add_argument("--scale_model", choices=list(MODEL_SIZES), default="5M", help="Model of the N and B tables.")
    parser.add_argument("--populations", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--model_sizes", choices=list(MODEL_SIZES), nargs="+", default=["5M", "30M"])
    parser.add_argument("--lowrank_populations", type=int, nargs="+", default=[8, 32], help="N of section 3.")
    parser.add_argument("--lowrank_rank", type=int, default=1)
    parser.add_argument("--lowrank_other_parameters", choices=["full", "frozen"], default="full")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=SECTIONS)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default on CPU: 1, since on a shared machine OpenMP threads waiting for each other "
        "while other processes hold the cores make timings erratic; raise it on a dedicated machine).",
    )
    parser.add_argument("--population_parallel", action="store_true", help="Also run population_parallel.py.")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a JSON spec: run one memory measurement
    if "--full" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**FULL)  # flags given explicitly still win
    return parser.parse_args(argv)


# --------------------------------------------------------------------------------------------------------------------
# Models and trainers


def save_random_qwen2(path: Path, size: str) -> tuple[Path, int]:
    """A randomly initialised float32 Qwen2 of preset `size` with the local tokenizer; returns (path, parameters)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trl_es.testing import build_tiny_tokenizer

    hidden, layers = MODEL_SIZES[size]
    heads = hidden // 64
    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, sum(p.numel() for p in model.parameters())


def make_trainer(method: str, model, population_size: int, batch_size: int, max_completion_length: int, steps: int,
                 cpu: bool, callbacks=(), **es_overrides):  # fmt: skip
    """An ESTrainer (population N, B prompts) or a GRPOTrainer (B prompts x N completions) with equal settings."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_es import ESConfig, ESTrainer
    from trl_es.testing import digit_fraction, digit_prompts

    common = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-es-bench-"),
        max_completion_length=max_completion_length,
        generation_kwargs={"min_new_tokens": max_completion_length},  # equal work: no completion stops early
        temperature=1.0,
        bf16=False,
        use_cpu=cpu,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    if method == "es-lowrank":
        method, es_overrides = "es", {"perturbation": "lowrank", **es_overrides}
    if method == "es":
        # sigma well above the 0.02 weight scale, so members write different completions and the update is never 0
        args = ESConfig(population_size=population_size, per_device_train_batch_size=batch_size, sigma=0.05,
                        learning_rate=0.01, **{**common, **es_overrides})  # fmt: skip
        trainer_class = ESTrainer
    else:  # GRPO's defaults otherwise: AdamW, gradient checkpointing, beta=0
        args = GRPOConfig(per_device_train_batch_size=population_size * batch_size, num_generations=population_size,
                          **common)  # fmt: skip
        trainer_class = GRPOTrainer
    dataset = digit_prompts(batch_size * steps)
    return trainer_class(
        model=model, reward_funcs=digit_fraction, args=args, train_dataset=dataset, callbacks=list(callbacks)
    )


def _synchronize(device):
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------------------------------
# Section 1: memory, one method per fresh process


def current_rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def peak_rss(reset: bool) -> int:
    """VmHWM since the last reset; without a reset, the process's lifetime peak (ru_maxrss)."""
    if reset:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def memory_worker(spec: dict) -> dict:
    """Train `spec["method"]` for `spec["steps"]` steps from a fresh model and measure the peak memory."""
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback

    from trl_es.testing import save_tiny_model

    cuda = spec["device"] == "cuda"
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    step_seconds = []

    class StepTimer(TrainerCallback):  # whole optimizer steps, GRPO's `optimizer.step` included
        def on_step_begin(self, *args, **kwargs):
            _synchronize(spec["device"])
            self.start = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            _synchronize(spec["device"])
            step_seconds.append(time.perf_counter() - self.start)

    settings = dict(
        population_size=spec["population_size"],
        batch_size=spec["batch_size"],
        max_completion_length=spec["max_completion_length"],
        cpu=not cuda,
    )
    # One step on a tiny model first loads every library and code path that the trainer imports lazily, so that their
    # code pages do not count as training memory on CPU.
    tiny = str(save_tiny_model(tempfile.mkdtemp(prefix="trl-es-bench-") + "/tiny"))
    make_trainer(spec["method"], tiny, steps=1, **settings).train()
    gc.collect()

    before_model = torch.cuda.memory_allocated() if cuda else current_rss()
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    if cuda:
        model.to("cuda")
    else:  # the loaded weights may still be lazily mapped from the file; make them ordinary memory now
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                tensor.data = tensor.data.clone()
    gc.collect()
    loaded = torch.cuda.memory_allocated() if cuda else current_rss()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        peak_reset = True
    else:
        peak_reset = reset_peak_rss()
    trainer = make_trainer(spec["method"], model, steps=spec["steps"], callbacks=[StepTimer()], **settings)
    trainer.train()
    peak = torch.cuda.max_memory_allocated() if cuda else peak_rss(peak_reset)

    parameters = [p for p in model.parameters() if p.requires_grad]
    breakdown = {"parameter_bytes": sum(p.numel() * p.element_size() for p in parameters)}
    if spec["method"].startswith("es"):
        pointers = {p.data_ptr() for p in parameters}  # a master tensor that is the parameter itself costs nothing
        masters = trainer.population.master.tensors.values()
        breakdown["es_master_bytes"] = sum(t.nbytes for t in masters if t.data_ptr() not in pointers)
        breakdown["es_reference_bytes"] = sum(t.nbytes for t in trainer._reference.values())
    else:
        states = trainer.optimizer.state.values()
        breakdown["grpo_optimizer_state_bytes"] = sum(
            value.nbytes for state in states for value in state.values() if torch.is_tensor(value)
        )
        breakdown["grpo_reference_model"] = trainer.ref_model is not None
        breakdown["grpo_gradient_checkpointing"] = bool(trainer.args.gradient_checkpointing)
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return {
        "method": spec["method"],
        "peak_bytes": peak - before_model,  # the loaded model included
        "added_bytes": peak - loaded,
        "model_bytes": loaded - before_model,
        "peak_reset": peak_reset,
        "step_seconds": step_seconds,  # sequential with the other method's run, so not used for ratios
        "mean_completion_length": statistics.mean(lengths) if lengths else None,
        **breakdown,
    }


def run_memory_worker(spec: dict) -> dict:
    command = [sys.executable, __file__, "--worker", json.dumps(spec)]
    # Large blocks in their own mappings, unmapped when freed: RSS follows live memory (see the module docstring).
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    process = subprocess.run(command, capture_output=True, text=True, env=environment)
    if process.returncode != 0:
        sys.stderr.write(process.stdout[-4000:] + process.stderr[-8000:])
        raise RuntimeError(f"The {spec['method']} memory run failed (exit {process.returncode}); its output is above.")
    line = next(line for line in reversed(process.stdout.splitlines()) if line.startswith(WORKER_PREFIX))
    return json.loads(line[len(WORKER_PREFIX) :])


def memory_section(cli, model_path: str, device: str) -> dict:
    spec = dict(
        model=model_path,
        device=device,
        population_size=cli.population_size,
        batch_size=cli.batch_size,
        max_completion_length=cli.max_completion_length,
        steps=cli.steps,
        threads=cli.threads,
    )
    es, lowrank, grpo = (run_memory_worker({**spec, "method": method}) for method in ("es", "es-lowrank", "grpo"))
    result = {
        "es": es,
        "es_lowrank": lowrank,
        "grpo": grpo,
        "memory_ratio_es_over_grpo": es["peak_bytes"] / grpo["peak_bytes"],
        "memory_ratio_added_es_over_grpo": es["added_bytes"] / grpo["added_bytes"],
        "memory_ratio_es_lowrank_over_grpo": lowrank["peak_bytes"] / grpo["peak_bytes"],
    }
    mib = 2**20
    how = "torch.cuda.max_memory_allocated" if device == "cuda" else "peak RSS"
    print(f"\n== 1. Peak memory of training, ES vs GRPO ({how}, from just before the model is loaded) ==")
    print(f"N={cli.population_size} (GRPO: group size), B={cli.batch_size} prompts, "
          f"{cli.population_size * cli.batch_size} completions of {cli.max_completion_length} tokens per step, "
          f"{cli.steps} steps, fresh process each")  # fmt: skip
    print(f"{'MiB':34s}{'ES':>10s}{'ES low-rank':>13s}{'GRPO':>10s}{'ES/GRPO':>10s}{'low-rank/GRPO':>15s}")
    rows = [("model weights (as loaded)", "model_bytes"), ("peak, weights included", "peak_bytes"),
            ("added by training", "added_bytes")]  # fmt: skip
    for label, key in rows:
        print(f"{label:34s}{es[key] / mib:10.1f}{lowrank[key] / mib:13.1f}{grpo[key] / mib:10.1f}"
              f"{es[key] / grpo[key]:10.3f}{lowrank[key] / grpo[key]:15.3f}")  # fmt: skip
    print(f"float32 parameters {es['parameter_bytes'] / mib:.1f} MiB. ES keeps a float32 master "
          f"({es['es_master_bytes'] / mib:.1f}; low-rank: {lowrank['es_master_bytes'] / mib:.1f}, the model is its "
          f"own master) and a CPU reference copy for es/param_distance ({es['es_reference_bytes'] / mib:.1f}, not on "
          f"the GPU); GRPO keeps gradients ({grpo['parameter_bytes'] / mib:.1f}) and "
          f"AdamW moments ({grpo['grpo_optimizer_state_bytes'] / mib:.1f}); GRPO gradient checkpointing="
          f"{grpo['grpo_gradient_checkpointing']}, reference model={grpo['grpo_reference_model']}")  # fmt: skip
    if not (es["peak_reset"] and grpo["peak_reset"]):
        print("warning: the peak-RSS mark could not be reset; the peaks are the processes' lifetime peak RSS")
    print(f"memory_ratio_es_over_grpo = {result['memory_ratio_es_over_grpo']:.3f} (target <= 0.4); "
          f"memory_ratio_added_es_over_grpo = {result['memory_ratio_added_es_over_grpo']:.3f}; "
          f"memory_ratio_es_lowrank_over_grpo = {result['memory_ratio_es_lowrank_over_grpo']:.3f}")  # fmt: skip
    return result


# --------------------------------------------------------------------------------------------------------------------
# Sections 2 and 3: step times, in this process


def warmed_up_es(model_path: str, population_size: int, batch_size: int, cli, device: str, **es_overrides):
    """An ESTrainer after one step through the Trainer loop (which creates the master), and its prompt batch."""
    from trl_es.testing import digit_prompts

    trainer = make_trainer("es", model_path, population_size, batch_size, cli.max_completion_length, steps=1,
                           cpu=device == "cpu", **es_overrides)  # fmt: skip
    trainer.train()
    return trainer, list(digit_prompts(batch_size)["prompt"])


def es_step_seconds(trainer, prompts: list[str]) -> float:
    start = time.perf_counter()
    trainer._es_step([{"prompt": prompt} for prompt in prompts])
    _synchronize(trainer.model.device)
    return time.perf_counter() - start


def generation_seconds(trainer, prompts: list[str]) -> float:
    """`model.generate` of the ES step's calls (N calls of B rows, the step's sampling seed), weights fixed."""
    import torch

    from trl_es.core.noise import sampling_seed

    model = trainer.model
    inputs = trainer.processing_class(
        prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
    ).to(model.device)
    seed = sampling_seed(trainer.args.seed, trainer.state.global_step)
    devices = [model.device] if model.device.type == "cuda" else []
    start = time.perf_counter()
    with torch.no_grad():
        for _member in range(trainer.args.population_size):
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed)
                output = model.generate(**inputs, generation_config=trainer.generation_config)
    _synchronize(model.device)
    seconds = time.perf_counter() - start
    assert output.shape[1] - inputs["input_ids"].shape[1] == trainer.args.max_completion_length
    return seconds


def grpo_step_seconds(trainer, prompts: list[str]) -> float:
    """One GRPO optimizer step as the Trainer loop runs it: generate and score, forward and backward, clip, AdamW."""
    rows = [{"prompt": prompt} for prompt in prompts for _ in range(trainer.args.num_generations)]
    start = time.perf_counter()
    trainer.training_step(trainer.model_wrapped, rows, None)
    if trainer.args.max_grad_norm > 0:
        trainer.accelerator.clip_grad_norm_(trainer.model.parameters(), trainer.args.max_grad_norm)
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    trainer.model.zero_grad()
    _synchronize(trainer.model.device)
    return time.perf_counter() - start


def es_phases(trainer, repetitions: int) -> dict:
    from trl_es.trl_compat import logged_metrics

    recorded = logged_metrics(trainer, "train")
    phases = {
        phase: statistics.median(recorded[f"es/time/{phase}"][-repetitions:])
        for phase in ("perturb", "generate", "reward", "update")
    }
    phases["zero_update_steps"] = sum(norm == 0 for norm in recorded["es/update_norm"][-repetitions:])
    return phases


def speed_section(cli, model_path: str, device: str) -> dict:
    population_size, batch_size = cli.population_size, cli.batch_size
    es, prompts = warmed_up_es(model_path, population_size, batch_size, cli, device)
    grpo = make_trainer("grpo", model_path, population_size, batch_size, cli.max_completion_length, steps=1,
                        cpu=device == "cpu")  # fmt: skip
    grpo.train()  # warm-up; creates the optimizer and its state
    times = {"es_step": [], "generation": [], "grpo_step": []}
    for _ in range(cli.repetitions):  # interleaved, so that all three see the same machine load
        times["es_step"].append(es_step_seconds(es, prompts))
        times["generation"].append(generation_seconds(es, prompts))
        times["grpo_step"].append(grpo_step_seconds(grpo, prompts))
    median = {name: statistics.median(values) for name, values in times.items()}
    completions = population_size * batch_size
    result = {
        "population_size": population_size,
        "batch_size": batch_size,
        "completions_per_step": completions,
        "seconds": times,
        "median_seconds": median,
        "es_phases": es_phases(es, cli.repetitions),
        "overhead_ratio_es_over_generation": median["es_step"] / median["generation"],
        "time_ratio_es_over_grpo_per_step": median["es_step"] / median["grpo_step"],
        "time_ratio_es_over_grpo_per_completion": (median["es_step"] / completions)
        / (median["grpo_step"] / completions),
    }
    phases = result["es_phases"]
    print(f"\n== 2. Step time: ES vs fixed-weight generation vs GRPO (interleaved, median of {cli.repetitions}) ==")
    print(f"N={population_size}, B={batch_size}: {completions} completions of {cli.max_completion_length} tokens "
          "per step for all three")  # fmt: skip
    print(f"{'':46s}{'s/step':>9s}{'ms/completion':>15s}")
    rows = [
        ("ES step", median["es_step"]),
        ("  of which writing member weights", phases["perturb"]),
        ("  of which generating (trainer path)", phases["generate"]),
        ("  of which scoring", phases["reward"]),
        ("  of which updating the master", phases["update"]),
        (f"model.generate, {population_size} calls x {batch_size} rows, fixed", median["generation"]),
        (f"GRPO step ({batch_size} prompts x {population_size} completions)", median["grpo_step"]),
    ]
    for label, seconds in rows:
        print(f"{label:46s}{seconds:9.3f}{1e3 * seconds / completions:15.1f}")
    for key in ("overhead_ratio_es_over_generation", "time_ratio_es_over_grpo_per_step",
                "time_ratio_es_over_grpo_per_completion"):  # fmt: skip
        print(f"{key} = {result[key]:.3f}")
    del es, grpo
    gc.collect()
    return result


def scale_section(cli, model_paths: dict[str, str], device: str) -> dict:
    measured = {}

    def measure(size, population_size, batch_size):
        key = (size, population_size, batch_size)
        if key not in measured:
            trainer, prompts = warmed_up_es(model_paths[size], population_size, batch_size, cli, device)
            seconds = [es_step_seconds(trainer, prompts) for _ in range(cli.repetitions)]
            completions = population_size * batch_size
            measured[key] = {
                "model": size,
                "population_size": population_size,
                "batch_size": batch_size,
                "seconds": seconds,
                "seconds_per_step": statistics.median(seconds),
                "seconds_per_completion": statistics.median(seconds) / completions,
                "phases": es_phases(trainer, cli.repetitions),
            }
            del trainer
            gc.collect()
        return measured[key]

    tables = {
        "population_size": [measure(cli.scale_model, n, cli.batch_size) for n in cli.populations],
        "batch_size": [measure(cli.scale_model, cli.population_size, b) for b in cli.batch_sizes],
        "model": [measure(size, cli.population_size, cli.batch_size) for size in cli.model_sizes],
    }
    print(f"\n== 5. ES seconds per step (median of {cli.repetitions}; {cli.max_completion_length} tokens) ==")
    for varied, rows in tables.items():
        print(f"-- {varied} varies")
        print(f"{'model':>6s}{'N':>5s}{'B':>5s}{'s/step':>9s}{'ms/compl':>10s}{'perturb':>9s}{'generate':>10s}"
              f"{'update':>9s}")  # fmt: skip
        for row in rows:
            phases = row["phases"]
            print(f"{row['model']:>6s}{row['population_size']:5d}{row['batch_size']:5d}{row['seconds_per_step']:9.3f}"
                  f"{1e3 * row['seconds_per_completion']:10.1f}{phases['perturb']:9.3f}{phases['generate']:10.3f}"
                  f"{phases['update']:9.3f}")  # fmt: skip
    return tables


def plain_batched_generation_seconds(trainer, prompts: list[str]) -> float:
    """`model.generate` of the N x B rows of a step in one call, fixed weights: the floor of any batched population."""
    import torch

    model = trainer.model
    rows = prompts * trainer.args.population_size
    inputs = trainer.processing_class(
        rows, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
    ).to(model.device)
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(**inputs, generation_config=trainer.generation_config)
    _synchronize(model.device)
    return time.perf_counter() - start


def lowrank_section(cli, model_path: str, device: str) -> dict:
    """Full-rank ES step vs low-rank ES step (the population in one batched call) vs plain batched generation."""
    rows = []
    for population_size in cli.lowrank_populations:
        full, prompts = warmed_up_es(model_path, population_size, cli.batch_size, cli, device)
        low, _ = warmed_up_es(model_path, population_size, cli.batch_size, cli, device, perturbation="lowrank",
                              lowrank_rank=cli.lowrank_rank,
                              lowrank_other_parameters=cli.lowrank_other_parameters)  # fmt: skip
        times = {"fullrank_step": [], "lowrank_step": [], "plain_batched_generation": []}
        for _ in range(cli.repetitions):  # interleaved
            times["fullrank_step"].append(es_step_seconds(full, prompts))
            times["lowrank_step"].append(es_step_seconds(low, prompts))
            times["plain_batched_generation"].append(plain_batched_generation_seconds(low, prompts))
        median = {name: statistics.median(values) for name, values in times.items()}
        plain = median["plain_batched_generation"]
        rows.append({
            "population_size": population_size,
            "batch_size": cli.batch_size,
            "seconds": times,
            "median_seconds": median,
            "lowrank_phases": es_phases(low, cli.repetitions),
            "lowrank_over_plain_generation": median["lowrank_step"] / plain,
            "fullrank_over_plain_generation": median["fullrank_step"] / plain,
            "fullrank_over_lowrank": median["fullrank_step"] / median["lowrank_step"],
        })  # fmt: skip
        del full, low
        gc.collect()
    print(f"\n== 3. Low-rank members (rank {cli.lowrank_rank}, other parameters {cli.lowrank_other_parameters}): ES "
          f"step vs plain batched generation (interleaved, median of {cli.repetitions}) ==")  # fmt: skip
    print(f"B={cli.batch_size} prompts, {cli.max_completion_length} tokens; plain = model.generate of the N x B rows "
          "in one call with fixed weights")  # fmt: skip
    print(f"{'N':>4s}{'full-rank s':>13s}{'low-rank s':>12s}{'plain s':>9s}{'low/plain':>11s}{'full/plain':>12s}")
    for row in rows:
        median = row["median_seconds"]
        print(f"{row['population_size']:4d}{median['fullrank_step']:13.3f}{median['lowrank_step']:12.3f}"
              f"{median['plain_batched_generation']:9.3f}{row['lowrank_over_plain_generation']:11.2f}"
              f"{row['fullrank_over_plain_generation']:12.2f}")  # fmt: skip
    return {"rows": rows}


def vllm_section(cli) -> dict:
    """benchmarks/vllm_es_overhead.py (colocate, tiny model), quick settings: ES step vs vLLM generation."""
    script = Path(__file__).with_name("vllm_es_overhead.py")
    command = [sys.executable, str(script), "--steps", str(cli.repetitions), "--warmup", "1"]
    process = subprocess.run(command, capture_output=True, text=True)
    print("\n== 4. vLLM colocate (benchmarks/vllm_es_overhead.py) ==")
    if process.returncode != 0:
        print(f"skipped: the vLLM benchmark failed (exit {process.returncode}): {process.stderr[-500:]}")
        return {"error": process.stderr[-2000:]}
    lines = process.stdout.splitlines()
    print("\n".join(line for line in lines if not line.startswith("RESULT ")))
    return json.loads(next(line for line in reversed(lines) if line.startswith("RESULT "))[len("RESULT ") :])


def population_parallel_section(cli, model_path: str) -> dict:
    script = Path(__file__).with_name("population_parallel.py")
    command = [sys.executable, str(script), "--model", model_path, "--population_size", str(cli.population_size),
               "--max_completion_length", str(cli.max_completion_length)]  # fmt: skip
    process = subprocess.run(command, capture_output=True, text=True, check=True)
    print("\n== Processes (benchmarks/population_parallel.py) ==")
    lines = process.stdout.splitlines()
    print("\n".join(line for line in lines if not line.startswith("RESULT ")))
    return json.loads(next(line for line in reversed(lines) if line.startswith("RESULT "))[len("RESULT ") :])


# --------------------------------------------------------------------------------------------------------------------


def machine_info(device: str) -> dict:
    import torch
    import transformers
    import trl

    info = {
        "device": device,
        "cpu_count": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def main():
    cli = parse_args()
    if cli.worker:
        print(WORKER_PREFIX + json.dumps(memory_worker(json.loads(cli.worker))))
        return
    started = time.perf_counter()
    import torch

    device = cli.device if cli.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if cli.threads is None and device == "cpu":
        cli.threads = 1
    if cli.threads:
        torch.set_num_threads(cli.threads)
    workdir = Path(tempfile.mkdtemp(prefix="trl-es-bench-"))
    # Models, output dirs and every subprocess's temporary files go under `workdir`, removed at the end.
    tempfile.tempdir = os.environ["TMPDIR"] = str(workdir)
    try:
        run(cli, device, workdir, started)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run(cli, device: str, workdir: Path, started: float):
    sizes = {cli.memory_model} if {"memory", "speed"} & set(cli.sections) else set()
    if "scale" in cli.sections:
        sizes |= {cli.scale_model, *cli.model_sizes}
    if "lowrank" in cli.sections:
        sizes.add(cli.scale_model)
    if cli.population_parallel:
        sizes.add(cli.scale_model)
    models = {size: save_random_qwen2(workdir / size, size) for size in sorted(sizes, key=list(MODEL_SIZES).index)}
    paths = {size: str(path) for size, (path, _) in models.items()}
    parameters = {size: count for size, (_, count) in models.items()}
    machine = machine_info(device)
    sizes_text = ", ".join(f"{size} = {count / 1e6:.1f}M parameters" for size, count in parameters.items())
    print(f"device {device}, {machine['cpus_available']} CPUs, torch {machine['torch']}, trl {machine['trl']}, load "
          f"average {machine['load_average'][0]:.1f}; random Qwen2 models: {sizes_text}")  # fmt: skip
    settings = {key: value for key, value in vars(cli).items() if key != "worker"}
    result = {"benchmark": "bench", "machine": machine, "settings": {**settings, "parameters": parameters}}
    if "memory" in cli.sections:
        result["memory"] = memory_section(cli, paths[cli.memory_model], device)
        for key in (
            "memory_ratio_es_over_grpo",
            "memory_ratio_added_es_over_grpo",
            "memory_ratio_es_lowrank_over_grpo",
        ):
            result[key] = result["memory"][key]
    if "speed" in cli.sections:
        result["speed"] = speed_section(cli, paths[cli.memory_model], device)
        for key in ("overhead_ratio_es_over_generation", "time_ratio_es_over_grpo_per_step",
                    "time_ratio_es_over_grpo_per_completion"):  # fmt: skip
            result[key] = result["speed"][key]
    if "lowrank" in cli.sections:
        result["lowrank"] = lowrank_section(cli, paths[cli.scale_model], device)
        for row in result["lowrank"]["rows"]:
            n = row["population_size"]
            result[f"lowrank_ratio_es_over_generation_n{n}"] = row["lowrank_over_plain_generation"]
            result[f"fullrank_ratio_es_over_batched_generation_n{n}"] = row["fullrank_over_plain_generation"]
    if "vllm" in cli.sections:
        result["vllm"] = vllm_section(cli)
        if "overhead_ratio_es_over_generation" in result["vllm"]:
            result["overhead_ratio_es_over_generation_vllm"] = result["vllm"]["overhead_ratio_es_over_generation"]
    if "scale" in cli.sections:
        result["scale"] = scale_section(cli, paths, device)
    if cli.population_parallel:
        result["population_parallel"] = population_parallel_section(cli, paths[cli.scale_model])
    result["elapsed_seconds"] = time.perf_counter() - started
    print(f"\nelapsed {result['elapsed_seconds']:.0f} s")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
