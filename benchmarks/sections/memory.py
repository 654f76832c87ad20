"""Section 1, memory: ES and GRPO train the same model on the same prompts, one fresh process per run.

Setups (`--memory_setups`): a float32 model (full-rank ES: the model plus its float32 master); bf16 weights with ES's
float32 master (the GPU-typical setup; GRPO on the same bf16 model with its default AdamW); low-rank ES on the float32
model (its own master), against GRPO in float32; and the same with a quarter of the members per generate call. GRPO
is TRL's GRPOTrainer with its defaults (AdamW, gradient checkpointing, beta=0 so no reference model,
`per_device_train_batch_size=8` with gradient accumulation up to the N x B completions of a step, all generated in
one call).

Peak memory is measured from just before the model is loaded (`benchmarks.harness.PeakMemory`):
`torch.cuda.max_memory_allocated` on CUDA; on CPU the process's peak RSS (VmHWM, reset after the model is loaded)
minus the RSS before the model was loaded. "peak" includes the model's own weights (what a GPU user must fit);
"added" is the peak minus the loaded model. On CPU the workers run with glibc's `MALLOC_MMAP_THRESHOLD_=65536
MALLOC_TRIM_THRESHOLD_=0` (`benchmarks.harness.LIVE_RSS_MALLOC`), so that RSS follows live memory, and a first
training step on a tiny model loads the libraries the trainers import lazily before the baseline is taken.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time

from benchmarks.harness import BENCHMARKS, LIVE_RSS_MALLOC, PeakMemory, run_worker, synchronize
from benchmarks.trainers import make_trainer

# setup -> (ES method, model dtype, label, calls per step: N / calls members per generate call); GRPO trains the
# same model in the same dtype
MEMORY_SETUPS = {
    "float32": ("es", "float32", "float32 model, full-rank ES", 1),
    "bf16": ("es", "bfloat16", "bf16 weights + float32 master (GPU-typical)", 1),
    "lowrank": ("es-lowrank", "float32", "low-rank ES, float32 (model = master)", 1),
    # the same with a quarter of the members per generate call (`population_batch_size`), a quarter of the KV cache
    "lowrank_split": ("es-lowrank", "float32", "low-rank ES, N/4 members per call", 4),
}
MEMORY_KEYS = {  # RESULT key -> (setup, "ratio" of the peaks or "added_ratio")
    "memory_ratio_es_over_grpo": ("bf16", "ratio"),
    "memory_ratio_es_over_grpo_fp32": ("float32", "ratio"),
    "memory_ratio_lowrank_over_grpo": ("lowrank", "ratio"),
    "memory_ratio_added_es_over_grpo": ("float32", "added_ratio"),
    "memory_ratio_es_lowrank_over_grpo": ("lowrank", "ratio"),
    "memory_ratio_lowrank_split_over_grpo": ("lowrank_split", "ratio"),
}
MIB = 2**20


def model_sizes(cli) -> set[str]:
    return {cli.memory_model} | ({cli.bf16_model} if "bf16" in cli.memory_setups else set())


def run(cli, paths: dict[str, str], device: str) -> dict:
    """Every setup's ES run and each dtype's GRPO run, each in its own worker process; prints the table."""
    spec = dict(
        section="memory",
        device=device,
        population_size=cli.population_size,
        batch_size=cli.batch_size,
        max_completion_length=cli.max_completion_length,
        steps=cli.steps,
        threads=cli.threads,
        grpo_micro_batch=cli.grpo_micro_batch,
        es_overrides={},
    )
    models = {"float32": cli.memory_model, "bfloat16": cli.bf16_model}

    def measure(method: str, dtype: str, overrides: dict) -> dict:
        run_spec = {**spec, "model": paths[models[dtype]], "method": method, "dtype": dtype, "es_overrides": overrides}
        return run_worker(BENCHMARKS / "bench.py", run_spec, f"{method} memory run", LIVE_RSS_MALLOC)

    dtypes = dict.fromkeys(MEMORY_SETUPS[setup][1] for setup in cli.memory_setups)
    grpo = {dtype: measure("grpo", dtype, {}) for dtype in dtypes}
    runs = {}
    for setup in cli.memory_setups:
        method, dtype, _, calls = MEMORY_SETUPS[setup]
        overrides = {"population_batch_size": max(1, cli.population_size // calls)} if calls > 1 else {}
        es = measure(method, dtype, overrides)
        runs[setup] = {"es": es, "grpo": grpo[dtype], "model": models[dtype], "es_overrides": overrides}
        runs[setup]["ratio"] = es["peak_bytes"] / grpo[dtype]["peak_bytes"]
        runs[setup]["added_ratio"] = es["added_bytes"] / grpo[dtype]["added_bytes"]
    outcome = {"setups": runs}
    for key, (setup, ratio) in MEMORY_KEYS.items():
        outcome[key] = runs[setup][ratio] if setup in runs else None
    print_table(cli, device, outcome, next(iter(grpo.values())))
    return outcome


def result_keys(outcome: dict) -> dict:
    return {key: outcome[key] for key in MEMORY_KEYS}


def print_table(cli, device: str, outcome: dict, any_grpo: dict) -> None:
    runs = outcome["setups"]
    how = "torch.cuda.max_memory_allocated" if device == "cuda" else "peak RSS"
    completions = cli.population_size * cli.batch_size
    print(f"\n== 1. Peak memory of training, ES vs GRPO ({how}, from just before the model is loaded) ==")
    print(f"N={cli.population_size} (GRPO: group size), B={cli.batch_size} prompts, {completions} completions of "
          f"{cli.max_completion_length} tokens per step, fresh process each, ES 1 step, GRPO {cli.steps}; GRPO trains "
          f"{any_grpo['grpo_micro_batch']} completions per forward/backward")  # fmt: skip
    print(f"{'setup (MiB)':46s}{'model':>8s}{'ES peak':>10s}{'GRPO peak':>11s}{'ratio':>8s}{'ES added':>10s}"
          f"{'GRPO added':>12s}{'ratio':>8s}")  # fmt: skip
    for setup, measured in runs.items():
        es, grpo = measured["es"], measured["grpo"]
        print(f"{MEMORY_SETUPS[setup][2]:46s}{es['model_bytes'] / MIB:8.1f}{es['peak_bytes'] / MIB:10.1f}"
              f"{grpo['peak_bytes'] / MIB:11.1f}{measured['ratio']:8.3f}{es['added_bytes'] / MIB:10.1f}"
              f"{grpo['added_bytes'] / MIB:12.1f}{measured['added_ratio']:8.3f}")  # fmt: skip
    for setup, measured in runs.items():
        es, grpo = measured["es"], measured["grpo"]
        print(f"{MEMORY_SETUPS[setup][2]} ({measured['model']} model): parameters "
              f"{es['parameter_bytes'] / MIB:.1f} MiB; ES's float32 master {es['es_master_bytes'] / MIB:.1f}; "
              f"GRPO's gradients {grpo['parameter_bytes'] / MIB:.1f} and AdamW moments "
              f"{grpo['grpo_optimizer_state_bytes'] / MIB:.1f}")  # fmt: skip
    some_es = next(iter(runs.values()))["es"]
    print(f"es/param_distance's starting weights: a {some_es['es_reference_file_bytes'] / MIB:.1f} MiB file, read one "
          f"tensor at a time when logging (no copy in memory); GRPO gradient checkpointing="
          f"{any_grpo['grpo_gradient_checkpointing']}, reference model="
          f"{any_grpo['grpo_reference_model']}")  # fmt: skip
    if not all(measured["es"]["peak_reset"] and measured["grpo"]["peak_reset"] for measured in runs.values()):
        print("warning: the peak-RSS mark could not be reset; the peaks are the processes' lifetime peak RSS")
    shown = "; ".join(f"{key} = {outcome[key]:.3f}" for key in MEMORY_KEYS if outcome[key] is not None)
    print(f"{shown} (targets <= 0.4)")


# --------------------------------------------------------------------------------------------------------------------
# The worker: one training run in a fresh process (`bench.py --worker <spec>`)


def worker(spec: dict) -> dict:
    """Train `spec["method"]` for `spec["steps"]` steps (ES: one) from a fresh model in `spec["dtype"]`; measure the
    peak memory, what makes it up and the step times."""
    import torch
    from transformers import AutoModelForCausalLM, TrainerCallback

    cuda = spec["device"] == "cuda"
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    step_seconds = []

    class StepTimer(TrainerCallback):  # whole optimizer steps, GRPO's `optimizer.step` included
        def on_step_begin(self, *args, **kwargs):
            synchronize(spec["device"])
            self.start = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            synchronize(spec["device"])
            step_seconds.append(time.perf_counter() - self.start)

    settings = dict(
        population_size=spec["population_size"],
        batch_size=spec["batch_size"],
        max_completion_length=spec["max_completion_length"],
        grpo_micro_batch=spec["grpo_micro_batch"],
        cpu=not cuda,
    )
    if not cuda:
        load_lazy_imports(spec["method"], settings)

    memory = PeakMemory(spec["device"])
    before_model = memory.current()
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=getattr(torch, spec["dtype"]))
    if cuda:
        model.to("cuda")
    else:  # the loaded weights may still be lazily mapped from the file; make them ordinary memory now
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                tensor.data = tensor.data.clone()
    gc.collect()
    loaded = memory.current()
    memory.reset_peak()
    steps = spec["steps"] if spec["method"] == "grpo" else 1
    trainer = make_trainer(spec["method"], model, steps=steps, callbacks=[StepTimer()], **settings,
                           **spec["es_overrides"])  # fmt: skip
    trainer.train()
    peak = memory.peak()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return {
        "method": spec["method"],
        "dtype": spec["dtype"],
        "peak_bytes": peak - before_model,  # the loaded model included
        "added_bytes": peak - loaded,
        "model_bytes": loaded - before_model,
        "peak_reset": memory.peak_was_reset,
        "step_seconds": step_seconds,
        "mean_completion_length": statistics.mean(lengths) if lengths else None,
        **memory_breakdown(trainer, model, spec["method"]),
    }


def load_lazy_imports(method: str, settings: dict) -> None:
    """One step on a tiny model loads every library and code path that the trainer imports lazily, so that their code
    pages do not count as training memory (CUDA's allocator counts tensors only, so CUDA skips this)."""
    from trl_es.testing import save_tiny_model

    tiny = str(save_tiny_model(tempfile.mkdtemp(prefix="trl-es-bench-") + "/tiny"))
    tiny_settings = {**settings, "population_size": 2, "batch_size": 2, "grpo_micro_batch": 2}
    make_trainer(method, tiny, **tiny_settings, steps=1).train()
    gc.collect()


def memory_breakdown(trainer, model, method: str) -> dict:
    """What the peak is made of: the trained parameters, and ES's master and starting-weights file or GRPO's
    optimizer state (and whether GRPO kept a reference model, checkpointed gradients, its micro-batch)."""
    import torch

    parameters = [p for p in model.parameters() if p.requires_grad]
    breakdown = {"parameter_bytes": sum(p.numel() * p.element_size() for p in parameters)}
    if method.startswith("es"):
        pointers = {p.data_ptr() for p in parameters}  # a master tensor that is the parameter itself costs nothing
        masters = trainer.population.master.tensors.values()
        breakdown["es_master_bytes"] = sum(t.nbytes for t in masters if t.data_ptr() not in pointers)
        reference = trainer._reference  # es/param_distance's starting weights: a file, read one tensor at a time
        breakdown["es_reference_file_bytes"] = os.path.getsize(reference.path) if reference is not None else 0
    else:
        states = trainer.optimizer.state.values()
        breakdown["grpo_optimizer_state_bytes"] = sum(
            value.nbytes for state in states for value in state.values() if torch.is_tensor(value)
        )
        breakdown["grpo_reference_model"] = trainer.ref_model is not None
        breakdown["grpo_gradient_checkpointing"] = bool(trainer.args.gradient_checkpointing)
        breakdown["grpo_micro_batch"] = trainer.args.per_device_train_batch_size
    return breakdown
