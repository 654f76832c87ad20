"""ES vs GRPO memory, ES overhead over generation, low-rank, vLLM and processes, measured side by side in one run.

    python benchmarks/bench.py                    # users' regime on 2 CPU cores (~20 min): 30M model, N=8, B=64, T=16
    python benchmarks/bench.py --preset quick     # the same sections on smaller settings (a few minutes)
    python benchmarks/bench.py --preset full      # larger model, populations and batches
    bash benchmarks/gpu_check.sh                  # --preset gpu on one GPU: a 0.5B Qwen2, bf16, B=128, T=128

Everything runs offline on random Qwen2 models built locally (byte-level BPE tokenizer trained here, vocabulary 320;
the 0.5B preset has Qwen2.5-0.5B's shape, vocabulary 151,936 included), with sampling at temperature 1, a dense toy
reward (the fraction of even token ids) and `min_new_tokens = max_completion_length`, so every completion has exactly
T tokens. B is prompts per step, T completion tokens, N the population (GRPO: the group size); both methods generate
N x B completions per step. Per member, ES writes the weights and applies its share of the update at a cost that grows
with the parameters P, while generating costs P x B x T: the overhead of ES over generation falls as 1 / (B x T), which
is why the headline figures use B x T >= 1,000 and section 2 prints the whole curve.

1. Memory, one fresh process per run: ES and GRPO train the same model on the same prompts in three setups, a float32
   model (full-rank ES: the model plus its float32 master), bf16 weights with ES's float32 master (the GPU-typical
   setup; GRPO on the same bf16 model with its default AdamW), and low-rank ES on the float32 model (its own master),
   against GRPO in float32. GRPO is TRL's GRPOTrainer with its defaults (AdamW, gradient checkpointing, beta=0 so no
   reference model, `per_device_train_batch_size=8` with gradient accumulation up to the N x B completions of a step,
   all generated in one call). Peak memory is measured from just before the model is loaded:
   `torch.cuda.max_memory_allocated` on CUDA; on CPU the process's peak RSS (VmHWM, reset after the model is loaded
   via /proc/self/clear_refs) minus the RSS before the model was loaded. "peak" includes the model's own weights
   (what a GPU user must fit); "added" is the peak minus the loaded model. On CPU the workers run with glibc's
   `MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0`, so every tensor above 64 KiB is its own mapping,
   returned to the system when freed: RSS then follows live memory instead of what the allocator keeps cached. A first
   training step on a tiny model loads the libraries the trainers import lazily before the baseline is taken.
2. Speed, in one process, interleaved, medians: an ES step (HF backend) vs `model.generate` of the same N calls of B
   rows with the same seeds and fixed weights, at the users' regime (`overhead_ratio_es_over_generation`), at a small
   batch (`..._small_batch`) and at the `--curve` points, printed against B x T. GRPO's step time comes from the
   float32 memory runs (separate processes, not interleaved): `time_ratio_es_over_grpo_per_step`.
3. Low-rank members, for N in `--lowrank_populations`: a full-rank ES step (members one after another), a low-rank
   ES step (`perturbation="lowrank"`: the population in one batched call) and `model.generate` of the same N x B rows
   in one call with fixed weights: `lowrank_ratio_over_batched_generation` (the largest N).
4. vLLM colocate: `benchmarks/vllm_es_overhead.py` at the users' N, B and T: `vllm_overhead_ratio`.
5. Processes: `benchmarks/population_parallel.py`, steps per second of 2 processes over 1: `speedup_2_processes`
   (and `speedup_2_processes_unsharded_update`: the same with `shard_update=False`, side by side).
6. (`--sections scale`) ES seconds per step against population size, prompt batch and model size.

On CPU every process uses one torch thread unless `--threads` says otherwise: on a shared machine, OpenMP threads
that wait for each other while other processes hold the cores slowed generation 5-10x at random in our runs.

The last line is `RESULT <json>` with every ratio (null, with the reason under `skipped`, for a section that did not
run), the raw numbers and the machine.
"""

import argparse
import gc
import importlib.util
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


def _blocks(hidden: int, layers: int) -> dict:
    """Heads of 64 dims, a quarter of them for keys and values, MLP 3x hidden; the local tokenizer's vocabulary."""
    heads = max(1, hidden // 64)
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 4), intermediate_size=3 * hidden)  # fmt: skip


# name -> Qwen2 config fields (head_dim 64 everywhere: vLLM-CPU needs at least 32)
MODEL_SIZES = {
    "tiny": _blocks(64, 2),
    "5M": _blocks(256, 6),
    "30M": _blocks(512, 10),
    "100M": _blocks(768, 14),
    "300M": _blocks(1024, 24),
    # Qwen2.5-0.5B's shape, its 151,936-token vocabulary and tied embeddings included (the local tokenizer uses the
    # first 320 ids; decoding drops the others, the token-id reward still scores them)
    "0.5B": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),  # fmt: skip
}
PRESETS = {
    "default": {},  # the argparse defaults below: the users' regime that fits 2 CPU cores
    "quick": dict(
        memory_model="5M",
        bf16_model="5M",
        batch_size=16,
        max_completion_length=16,
        small_batch="4x4x16",
        curve=["4x64x16"],
        lowrank_populations=[8, 16],
        repetitions=2,
        processes_model="tiny",
    ),
    "full": dict(
        memory_model="100M",
        batch_size=64,
        max_completion_length=32,
        repetitions=5,
        curve=["4x16x16", "4x64x64", "4x128x64"],
        lowrank_populations=[8, 32, 64],
        sections=["memory", "speed", "lowrank", "vllm", "processes", "scale"],
        scale_model="30M",
        populations=[4, 8, 16, 32],
        batch_sizes=[2, 4, 8, 16],
        model_sizes=["5M", "30M", "100M"],
    ),
    # benchmarks/gpu_check.sh: one GPU, a ~0.5B model in bf16, B and T where users run, under 8 minutes on an H200
    "gpu": dict(
        device="cuda",
        memory_model="0.5B",
        bf16_model="0.5B",
        lowrank_model="0.5B",
        batch_size=128,
        max_completion_length=128,
        small_batch="4x4x32",
        curve=["4x32x64"],
        lowrank_populations=[8, 32],
        lowrank_batch_size=16,
        lowrank_fullrank=False,  # 32 members one after another would take minutes
        repetitions=2,
        sections=["memory", "speed", "lowrank", "vllm", "processes"],
    ),
    # tests/test_gpu_check.py and tests/test_bench.py: every code path, on the tiny model, in seconds
    "tiny": dict(
        memory_model="tiny",
        bf16_model="tiny",
        lowrank_model="tiny",
        processes_model="tiny",
        population_size=2,
        batch_size=2,
        max_completion_length=4,
        small_batch="2x1x4",
        curve=[],
        lowrank_populations=[2],
        steps=1,
        repetitions=1,
        grpo_micro_batch=2,
    ),
}
WORKER_PREFIX = "WORKER "
SECTIONS = ["memory", "speed", "lowrank", "vllm", "processes", "scale"]
DEFAULT_SECTIONS = ["memory", "speed", "lowrank", "vllm", "processes"]
# Every RESULT holds these (null where the section did not run), with the setting each one is measured at
REQUIRED_KEYS = {
    "overhead_ratio_es_over_generation": "speed: full-rank ES step / model.generate, users' regime (N, B, T)",
    "overhead_ratio_es_over_generation_small_batch": "speed: the same at --small_batch",
    "memory_ratio_es_over_grpo": "memory: bf16 weights + ES's float32 master vs GRPO on the bf16 model",
    "memory_ratio_es_over_grpo_fp32": "memory: float32 model, full-rank ES vs GRPO",
    "memory_ratio_lowrank_over_grpo": "memory: low-rank ES on the float32 model (its own master) vs GRPO in float32",
    "lowrank_ratio_over_batched_generation": "lowrank: low-rank ES step / one batched generate, largest N",
    "vllm_overhead_ratio": "vllm: colocate ES step / vLLM generation of the same completions",
    "speedup_2_processes": "processes: steps per second, 2 processes / 1",
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=list(PRESETS), default="default", help="Defaults for the flags below.")
    parser.add_argument("--full", action="store_true", help="The same as --preset full.")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--memory_model", choices=list(MODEL_SIZES), default="30M", help="Model of sections 1-2.")
    parser.add_argument(
        "--bf16_model",
        choices=list(MODEL_SIZES),
        default=None,
        help="Model of the bf16 memory setup (default: --memory_model on CUDA; 5M on CPU, where bf16 matrix products "
        "run several times slower than float32 without AVX512-BF16/AMX).",
    )
    parser.add_argument(
        "--memory_setups",
        nargs="+",
        choices=list(MEMORY_SETUPS),
        default=["float32", "bf16", "lowrank", "lowrank_split"],
        help="The setups of section 1 (lowrank_split: low-rank with a quarter of the members per generate call).",
    )
    parser.add_argument("--population_size", type=int, default=8, help="N of sections 1-2 (GRPO: group size).")
    parser.add_argument("--batch_size", type=int, default=64, help="Prompts per step (B) of sections 1-4.")
    parser.add_argument("--max_completion_length", type=int, default=16, help="Completion tokens (T), sections 1-4.")
    parser.add_argument("--small_batch", default="4x4x16", help="NxBxT of the small-batch row of section 2.")
    parser.add_argument("--curve", nargs="*", default=["4x16x16", "4x64x32"], help="More NxBxT points of section 2.")
    parser.add_argument(
        "--steps",
        type=int,
        default=2,
        help="GRPO's training steps per memory run (its peak comes in the second, when AdamW's moments exist in the "
        "backward pass); ES runs one step, which already holds everything ES ever holds.",
    )
    parser.add_argument(
        "--grpo_micro_batch", type=int, default=8, help="GRPO's per_device_train_batch_size (TRL's default, 8)."
    )
    parser.add_argument("--repetitions", type=int, default=3, help="Timed repetitions in sections 2 and 3.")
    parser.add_argument("--lowrank_model", choices=list(MODEL_SIZES), default="5M", help="Model of section 3.")
    parser.add_argument("--lowrank_populations", type=int, nargs="+", default=[8, 32], help="N of section 3.")
    parser.add_argument("--lowrank_batch_size", type=int, default=None, help="B of section 3 (default: --batch_size).")
    parser.add_argument(
        "--lowrank_fullrank",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Also time the full-rank step in section 3 (its members one after another: N generate calls).",
    )
    parser.add_argument("--lowrank_rank", type=int, default=1)
    parser.add_argument("--lowrank_other_parameters", choices=["full", "frozen"], default="full")
    parser.add_argument("--vllm_model", default=None, help="Model of section 4 (default: the tiny test model).")
    parser.add_argument("--processes_model", choices=list(MODEL_SIZES), default="5M", help="Model of section 5.")
    parser.add_argument("--scale_model", choices=list(MODEL_SIZES), default="5M", help="Model of the N and B tables.")
    parser.add_argument("--populations", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--model_sizes", choices=list(MODEL_SIZES), nargs="+", default=["5M", "30M"])
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=DEFAULT_SECTIONS)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default on CPU: 1, since on a shared machine OpenMP threads waiting for each other "
        "while other processes hold the cores make timings erratic; raise it on a dedicated machine).",
    )
    parser.add_argument("--population_parallel", action="store_true", help="The same as adding `processes`.")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a JSON spec: run one memory measurement
    argv = sys.argv[1:] if argv is None else list(argv)
    known, _ = parser.parse_known_args(argv)
    preset = "full" if known.full else known.preset
    parser.set_defaults(**PRESETS[preset])  # flags given explicitly still win
    cli = parser.parse_args(argv)
    cli.preset = preset
    if cli.population_parallel and "processes" not in cli.sections:
        cli.sections = [*cli.sections, "processes"]
    return cli


def parse_setting(text: str) -> tuple[int, int, int]:
    """`"NxBxT"` -> (population size, prompts per step, completion tokens)."""
    try:
        population_size, batch_size, tokens = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise SystemExit(  # noqa: B904 (a usage error, not a failure inside the handler)
            f"A setting is NxBxT, e.g. 4x64x16 (N=4 members, B=64 prompts, T=16 tokens); got {text!r}."
        )
    return population_size, batch_size, tokens


# --------------------------------------------------------------------------------------------------------------------
# Models and trainers


def save_random_qwen2(path: Path, size: str) -> tuple[Path, int]:
    """A randomly initialised Qwen2 of preset `size` with the local tokenizer; returns (path, parameters). Saved in
    bfloat16 when the preset is larger than a GiB in float32 (every run loads it in the dtype it measures)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from trl_es.testing import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    fields = {"vocab_size": len(tokenizer), "tie_word_embeddings": False, **MODEL_SIZES[size]}
    config = Qwen2Config(
        **fields,
        head_dim=64,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    parameters = sum(p.numel() for p in model.parameters())
    if parameters * 4 > 2**30:
        model = model.to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, parameters


def even_token_fraction(completion_ids, **kwargs) -> list[float]:
    """Reward: the fraction of even token ids in each completion. Dense (members' fitness differs, so the update is
    never zero) and defined for any vocabulary, also ids the local tokenizer cannot decode."""
    return [sum(1 - token % 2 for token in ids) / len(ids) if ids else 0.0 for ids in completion_ids]


def make_trainer(method: str, model, population_size: int, batch_size: int, max_completion_length: int, steps: int,
                 cpu: bool, callbacks=(), grpo_micro_batch: int | None = None, **es_overrides):  # fmt: skip
    """An ESTrainer (population N, B prompts) or a GRPOTrainer (B prompts x N completions) with equal settings.

    GRPO trains `grpo_micro_batch` completions per forward and backward (default: all N x B in one), accumulating
    gradients over the step; it generates the step's N x B completions in one call either way."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_es import ESConfig, ESTrainer
    from trl_es.testing import digit_prompts

    common = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-es-bench-"),
        max_completion_length=max_completion_length,
        generation_kwargs={"min_new_tokens": max_completion_length},  # equal work: no completion stops early
        temperature=1.0,
        bf16=False,  # the model's own dtype decides: float32 or bf16 weights, no autocast
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
        # sigma well above the 0.02 weight scale, so members write different completions
        args = ESConfig(population_size=population_size, per_device_train_batch_size=batch_size, sigma=0.05,
                        learning_rate=0.01, **{**common, **es_overrides})  # fmt: skip
        trainer_class = ESTrainer
    else:  # GRPO's defaults otherwise: AdamW, gradient checkpointing, beta=0
        completions = population_size * batch_size
        micro_batch = min(grpo_micro_batch or completions, completions)
        if completions % micro_batch:
            raise SystemExit(f"--grpo_micro_batch {micro_batch} must divide the N x B = {completions} completions.")
        args = GRPOConfig(per_device_train_batch_size=micro_batch, num_generations=population_size,
                          gradient_accumulation_steps=completions // micro_batch, **common)  # fmt: skip
        trainer_class = GRPOTrainer
    dataset = digit_prompts(batch_size * steps)
    return trainer_class(
        model=model, reward_funcs=even_token_fraction, args=args, train_dataset=dataset, callbacks=list(callbacks)
    )


def _synchronize(device):
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _median(values: list[float]) -> float:
    return statistics.median(values)


# --------------------------------------------------------------------------------------------------------------------
# Section 1: memory, one run per fresh process


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
    """Train `spec["method"]` for `spec["steps"]` steps from a fresh model in `spec["dtype"]`; measure the peak."""
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
        grpo_micro_batch=spec["grpo_micro_batch"],
        cpu=not cuda,
    )
    if not cuda:
        # One step on a tiny model first loads every library and code path that the trainer imports lazily, so that
        # their code pages do not count as training memory (CUDA's allocator counts tensors only).
        tiny = str(save_tiny_model(tempfile.mkdtemp(prefix="trl-es-bench-") + "/tiny"))
        make_trainer(spec["method"], tiny, **{**settings, "population_size": 2, "batch_size": 2,
                     "grpo_micro_batch": 2}, steps=1).train()  # fmt: skip
        gc.collect()

    before_model = torch.cuda.memory_allocated() if cuda else current_rss()
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=getattr(torch, spec["dtype"]))
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
    steps = spec["steps"] if spec["method"] == "grpo" else 1
    trainer = make_trainer(spec["method"], model, steps=steps, callbacks=[StepTimer()], **settings,
                           **spec["es_overrides"])  # fmt: skip
    trainer.train()
    peak = torch.cuda.max_memory_allocated() if cuda else peak_rss(peak_reset)

    parameters = [p for p in model.parameters() if p.requires_grad]
    breakdown = {"parameter_bytes": sum(p.numel() * p.element_size() for p in parameters)}
    if spec["method"].startswith("es"):
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
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return {
        "method": spec["method"],
        "dtype": spec["dtype"],
        "peak_bytes": peak - before_model,  # the loaded model included
        "added_bytes": peak - loaded,
        "model_bytes": loaded - before_model,
        "peak_reset": peak_reset,
        "step_seconds": step_seconds,
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


def memory_section(cli, model_paths: dict[str, str], device: str) -> dict:
    spec = dict(
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
    dtypes = dict.fromkeys(MEMORY_SETUPS[setup][1] for setup in cli.memory_setups)
    grpo = {
        dtype: run_memory_worker({**spec, "model": model_paths[models[dtype]], "method": "grpo", "dtype": dtype})
        for dtype in dtypes
    }
    runs = {}
    for setup in cli.memory_setups:
        method, dtype, _, calls = MEMORY_SETUPS[setup]
        overrides = {"population_batch_size": max(1, cli.population_size // calls)} if calls > 1 else {}
        es = run_memory_worker({**spec, "model": model_paths[models[dtype]], "method": method, "dtype": dtype,
                                "es_overrides": overrides})  # fmt: skip
        runs[setup] = {"es": es, "grpo": grpo[dtype], "model": models[dtype], "es_overrides": overrides}
        runs[setup]["ratio"] = es["peak_bytes"] / grpo[dtype]["peak_bytes"]
        runs[setup]["added_ratio"] = es["added_bytes"] / grpo[dtype]["added_bytes"]
    result = {"setups": runs}
    for key, (setup, ratio) in MEMORY_KEYS.items():
        result[key] = runs[setup][ratio] if setup in runs else None
    mib = 2**20
    how = "torch.cuda.max_memory_allocated" if device == "cuda" else "peak RSS"
    completions = cli.population_size * cli.batch_size
    any_grpo = next(iter(grpo.values()))
    print(f"\n== 1. Peak memory of training, ES vs GRPO ({how}, from just before the model is loaded) ==")
    print(f"N={cli.population_size} (GRPO: group size), B={cli.batch_size} prompts, {completions} completions of "
          f"{cli.max_completion_length} tokens per step, fresh process each, ES 1 step, GRPO {cli.steps}; GRPO trains "
          f"{any_grpo['grpo_micro_batch']} completions per forward/backward")  # fmt: skip
    print(f"{'setup (MiB)':46s}{'model':>8s}{'ES peak':>10s}{'GRPO peak':>11s}{'ratio':>8s}{'ES added':>10s}"
          f"{'GRPO added':>12s}{'ratio':>8s}")  # fmt: skip
    for setup, run in runs.items():
        es, grpo_run = run["es"], run["grpo"]
        print(f"{MEMORY_SETUPS[setup][2]:46s}{es['model_bytes'] / mib:8.1f}{es['peak_bytes'] / mib:10.1f}"
              f"{grpo_run['peak_bytes'] / mib:11.1f}{run['ratio']:8.3f}{es['added_bytes'] / mib:10.1f}"
              f"{grpo_run['added_bytes'] / mib:12.1f}{run['added_ratio']:8.3f}")  # fmt: skip
    for setup, run in runs.items():
        es, grpo_run = run["es"], run["grpo"]
        print(f"{MEMORY_SETUPS[setup][2]} ({run['model']} model): parameters {es['parameter_bytes'] / mib:.1f} MiB; "
              f"ES's float32 master {es['es_master_bytes'] / mib:.1f}; GRPO's gradients "
              f"{grpo_run['parameter_bytes'] / mib:.1f} and AdamW moments "
              f"{grpo_run['grpo_optimizer_state_bytes'] / mib:.1f}")  # fmt: skip
    some_es = next(iter(runs.values()))["es"]
    print(f"es/param_distance's starting weights: a {some_es['es_reference_file_bytes'] / mib:.1f} MiB file, read one "
          f"tensor at a time when logging (no copy in memory); GRPO gradient checkpointing="
          f"{any_grpo['grpo_gradient_checkpointing']}, reference model="
          f"{any_grpo['grpo_reference_model']}")  # fmt: skip
    if not all(run["es"]["peak_reset"] and run["grpo"]["peak_reset"] for run in runs.values()):
        print("warning: the peak-RSS mark could not be reset; the peaks are the processes' lifetime peak RSS")
    shown = "; ".join(f"{key} = {result[key]:.3f}" for key in MEMORY_KEYS if result[key] is not None)
    print(f"{shown} (targets <= 0.4)")
    return result


# --------------------------------------------------------------------------------------------------------------------
# Sections 2 and 3: step times, in this process


def warmed_up_es(model_path: str, population_size: int, batch_size: int, tokens: int, device: str, **es_overrides):
    """An ESTrainer after one step through the Trainer loop (which creates the master), and its prompt batch."""
    from trl_es.testing import digit_prompts

    trainer = make_trainer("es", model_path, population_size, batch_size, tokens, steps=1, cpu=device == "cpu",
                           **es_overrides)  # fmt: skip
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


def es_phases(trainer, repetitions: int) -> dict:
    from trl_es.trl_compat import logged_metrics

    recorded = logged_metrics(trainer, "train")
    phases = {
        phase: _median(recorded[f"es/time/{phase}"][-repetitions:])
        for phase in ("perturb", "generate", "reward", "update")
    }
    phases["zero_update_steps"] = sum(norm == 0 for norm in recorded["es/update_norm"][-repetitions:])
    return phases


def overhead_row(model_path: str, setting: tuple[int, int, int], cli, device: str) -> dict:
    """ES step vs fixed-weight generation of the same calls at one NxBxT setting, interleaved, medians."""
    population_size, batch_size, tokens = setting
    trainer, prompts = warmed_up_es(model_path, population_size, batch_size, tokens, device)
    times = {"es_step": [], "generation": []}
    for _ in range(cli.repetitions):  # interleaved, so that both see the same machine load
        times["es_step"].append(es_step_seconds(trainer, prompts))
        times["generation"].append(generation_seconds(trainer, prompts))
    median = {name: _median(values) for name, values in times.items()}
    from trl_es.trl_compat import logged_metrics

    generated = logged_metrics(trainer, "train")["es/time/generate"][-cli.repetitions :]
    # ES's own work (the step minus its generation phase) is steadier than the two generations on a loaded machine
    own_work = _median([step - phase for step, phase in zip(times["es_step"], generated, strict=True)])
    row = {
        "population_size": population_size,
        "batch_size": batch_size,
        "max_completion_length": tokens,
        "prompt_tokens_per_member_step": batch_size * tokens,
        "seconds": times,
        "median_seconds": median,
        "es_phases": es_phases(trainer, cli.repetitions),
        "overhead_ratio": median["es_step"] / median["generation"],
        "es_own_work_seconds": own_work,
        "overhead_ratio_own_work": 1 + own_work / median["generation"],
    }
    # Per member, ES's own work (writing weights, its share of the update) against generating B x T tokens: the
    # overhead is about 1 + c / (B x T); c is what this row says it is.
    row["fixed_cost_in_row_tokens"] = (row["overhead_ratio"] - 1) * batch_size * tokens
    del trainer
    gc.collect()
    return row


def speed_section(cli, model_path: str, device: str) -> dict:
    users = (cli.population_size, cli.batch_size, cli.max_completion_length)
    small = parse_setting(cli.small_batch)
    extra = [parse_setting(text) for text in cli.curve]
    settings = list(dict.fromkeys([users, small, *extra]))  # measured in this order; users' regime first
    rows = {setting: overhead_row(model_path, setting, cli, device) for setting in settings}
    curve = sorted(rows.values(), key=lambda row: (row["prompt_tokens_per_member_step"], row["population_size"]))
    users_row, small_row = rows[users], rows[small]
    crossing = users_row["fixed_cost_in_row_tokens"] / 0.05 if users_row["overhead_ratio"] > 1 else None
    result = {
        "users_regime": users_row,
        "small_batch": small_row,
        "curve": curve,
        "overhead_ratio_es_over_generation": users_row["overhead_ratio"],
        "overhead_ratio_es_over_generation_small_batch": small_row["overhead_ratio"],
        "overhead_crosses_1_05_at_prompt_tokens": crossing,
    }
    print(f"\n== 2. ES step vs model.generate of the same calls, against B x T (interleaved, median of "
          f"{cli.repetitions}) ==")  # fmt: skip
    print(f"{'':3s}{'N':>4s}{'B':>5s}{'T':>5s}{'B x T':>7s}{'ES s':>9s}{'gen s':>9s}{'ratio':>8s}{'perturb':>9s}"
          f"{'update':>9s}{'own':>7s}{'c':>8s}")  # fmt: skip
    for row in curve:
        setting = (row["population_size"], row["batch_size"], row["max_completion_length"])
        mark = "*" if setting == users else "s" if setting == small else ""
        phases, median = row["es_phases"], row["median_seconds"]
        print(f"{mark:3s}{row['population_size']:4d}{row['batch_size']:5d}{row['max_completion_length']:5d}"
              f"{row['prompt_tokens_per_member_step']:7d}{median['es_step']:9.3f}{median['generation']:9.3f}"
              f"{row['overhead_ratio']:8.3f}{phases['perturb']:9.3f}{phases['update']:9.3f}"
              f"{row['overhead_ratio_own_work']:7.3f}{row['fixed_cost_in_row_tokens']:8.0f}")  # fmt: skip
    print(
        "* users' regime (overhead_ratio_es_over_generation), s small batch (..._small_batch); perturb and update "
        "are the ES step's seconds writing member weights and updating the master; own = 1 + (ES step - its "
        "generation phase) / generation, the ratio from ES's own work only (steadier under load); c = (ratio - 1) x "
        "B x T, ES's work per member in row-tokens of generation (about constant: the overhead falls as 1 / (B x T))"
    )
    if crossing is not None:
        print(f"at the users' regime's c, the overhead falls to 1.05 at B x T ~ {crossing:,.0f} prompt-tokens per "
              "member (an extrapolation: generation's cost per token also changes with the batch)")  # fmt: skip
    if any(row["es_phases"]["zero_update_steps"] for row in curve):
        print("warning: some timed steps had a zero update (equal fitness), which skips the update's noise")
    del rows
    return result


def scale_section(cli, model_paths: dict[str, str], device: str) -> dict:
    measured = {}

    def measure(size, population_size, batch_size):
        key = (size, population_size, batch_size)
        if key not in measured:
            trainer, prompts = warmed_up_es(model_paths[size], population_size, batch_size, cli.max_completion_length,
                                            device)  # fmt: skip
            seconds = [es_step_seconds(trainer, prompts) for _ in range(cli.repetitions)]
            completions = population_size * batch_size
            measured[key] = {
                "model": size,
                "population_size": population_size,
                "batch_size": batch_size,
                "seconds": seconds,
                "seconds_per_step": _median(seconds),
                "seconds_per_completion": _median(seconds) / completions,
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
    print(f"\n== 6. ES seconds per step (median of {cli.repetitions}; {cli.max_completion_length} tokens) ==")
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
    batch_size, tokens = cli.lowrank_batch_size or cli.batch_size, cli.max_completion_length
    rows = []
    for population_size in cli.lowrank_populations:
        low, prompts = warmed_up_es(model_path, population_size, batch_size, tokens, device, perturbation="lowrank",
                              lowrank_rank=cli.lowrank_rank,
                              lowrank_other_parameters=cli.lowrank_other_parameters)  # fmt: skip
        full = (
            warmed_up_es(model_path, population_size, batch_size, tokens, device)[0] if cli.lowrank_fullrank else None
        )
        times = {"lowrank_step": [], "plain_batched_generation": [], **({"fullrank_step": []} if full else {})}
        for _ in range(cli.repetitions):  # interleaved
            if full is not None:
                times["fullrank_step"].append(es_step_seconds(full, prompts))
            times["lowrank_step"].append(es_step_seconds(low, prompts))
            times["plain_batched_generation"].append(plain_batched_generation_seconds(low, prompts))
        median = {name: _median(values) for name, values in times.items()}
        plain = median["plain_batched_generation"]
        row = {
            "population_size": population_size,
            "batch_size": batch_size,
            "max_completion_length": tokens,
            "seconds": times,
            "median_seconds": median,
            "lowrank_phases": es_phases(low, cli.repetitions),
            "lowrank_over_plain_generation": median["lowrank_step"] / plain,
        }
        if full is not None:
            row["fullrank_over_plain_generation"] = median["fullrank_step"] / plain
            row["fullrank_over_lowrank"] = median["fullrank_step"] / median["lowrank_step"]
        rows.append(row)
        del full, low
        gc.collect()
    print(f"\n== 3. Low-rank members (rank {cli.lowrank_rank}, other parameters {cli.lowrank_other_parameters}): ES "
          f"step vs plain batched generation (interleaved, median of {cli.repetitions}) ==")  # fmt: skip
    print(f"{cli.lowrank_model} model, B={batch_size} prompts, {tokens} tokens; plain = model.generate of the N x B "
          "rows in one call with fixed weights")  # fmt: skip
    print(f"{'N':>4s}{'full-rank s':>13s}{'low-rank s':>12s}{'plain s':>9s}{'low/plain':>11s}{'full/plain':>12s}")
    for row in rows:
        median, nan = row["median_seconds"], float("nan")
        print(f"{row['population_size']:4d}{median.get('fullrank_step', nan):13.3f}{median['lowrank_step']:12.3f}"
              f"{median['plain_batched_generation']:9.3f}{row['lowrank_over_plain_generation']:11.2f}"
              f"{row.get('fullrank_over_plain_generation', nan):12.2f}")  # fmt: skip
    largest = max(rows, key=lambda row: row["population_size"])
    return {"rows": rows, "lowrank_ratio_over_batched_generation": largest["lowrank_over_plain_generation"]}


def _script_result(process) -> dict:
    lines = process.stdout.splitlines()
    print("\n".join(line for line in lines if not line.startswith("RESULT ")))
    return json.loads(next(line for line in reversed(lines) if line.startswith("RESULT "))[len("RESULT ") :])


def vllm_section(cli, device: str) -> dict:
    """benchmarks/vllm_es_overhead.py (colocate) at the users' N, B and T: ES step vs vLLM generation."""
    print("\n== 4. vLLM colocate (benchmarks/vllm_es_overhead.py) ==")
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vLLM is not installed"}
    script = Path(__file__).with_name("vllm_es_overhead.py")
    command = [sys.executable, str(script), "--steps", str(cli.repetitions), "--warmup", "1",
               "--population_size", str(cli.population_size), "--batch_size", str(cli.batch_size),
               "--max_completion_length", str(cli.max_completion_length),
               *(["--model", cli.vllm_model] if cli.vllm_model else []),
               *(["--cuda"] if device == "cuda" else [])]  # fmt: skip
    process = subprocess.run(command, capture_output=True, text=True)
    if process.returncode != 0:
        return {"skipped": f"the vLLM benchmark failed (exit {process.returncode}): {process.stderr[-1500:]}"}
    result = _script_result(process)
    result["vllm_overhead_ratio"] = result["overhead_ratio_es_over_generation"]
    return result


def processes_section(cli, model_path: str, device: str) -> dict:
    """benchmarks/population_parallel.py: the same steps with 1 and 2 processes."""
    print("\n== 5. Processes (benchmarks/population_parallel.py) ==")
    import torch

    if device == "cuda" and torch.cuda.device_count() < 2:
        return {"skipped": f"2 processes need 2 GPUs; this machine has {torch.cuda.device_count()}"}
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if device == "cpu" and cpus < 2:
        return {"skipped": f"2 processes need 2 CPU cores; this process may use {cpus}"}
    script = Path(__file__).with_name("population_parallel.py")
    command = [sys.executable, str(script), "--model", model_path, "--population_size", str(cli.population_size),
               "--batch_size", str(cli.batch_size), "--max_completion_length", str(cli.max_completion_length),
               "--steps", str(max(cli.repetitions, 2)), "--compare_shard_update"]  # fmt: skip
    process = subprocess.run(command, capture_output=True, text=True)
    if process.returncode != 0:
        return {"skipped": f"the processes benchmark failed (exit {process.returncode}): {process.stderr[-1500:]}"}
    result = _script_result(process)
    for key, shard_update in (("speedup_2_processes", True), ("speedup_2_processes_unsharded_update", False)):
        two = [run for run in result["runs"] if run["processes"] == 2 and run["shard_update"] == shard_update]
        result[key] = two[0]["speedup"] if two else None
    return result


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
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but torch sees no CUDA device. Use --device cpu (with --preset tiny to try).")
    if cli.bf16_model is None:
        cli.bf16_model = cli.memory_model if device == "cuda" else "5M"
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
    sections = set(cli.sections)
    sizes = set()
    if "memory" in sections:
        sizes |= {cli.memory_model} | ({cli.bf16_model} if "bf16" in cli.memory_setups else set())
    if "speed" in sections:
        sizes.add(cli.memory_model)
    if "lowrank" in sections:
        sizes.add(cli.lowrank_model)
    if "processes" in sections:
        sizes.add(cli.processes_model)
    if "scale" in sections:
        sizes |= {cli.scale_model, *cli.model_sizes}
    models = {size: save_random_qwen2(workdir / size, size) for size in sorted(sizes, key=list(MODEL_SIZES).index)}
    paths = {size: str(path) for size, (path, _) in models.items()}
    parameters = {size: count for size, (_, count) in models.items()}
    machine = machine_info(device)
    sizes_text = ", ".join(f"{size} = {count / 1e6:.1f}M parameters" for size, count in parameters.items())
    print(f"device {device}, {machine['cpus_available']} CPUs, torch {machine['torch']}, trl {machine['trl']}, load "
          f"average {machine['load_average'][0]:.1f}; preset {cli.preset}; random Qwen2 models: "
          f"{sizes_text}")  # fmt: skip
    print(f"users' regime: N={cli.population_size}, B={cli.batch_size}, T={cli.max_completion_length} (B x T = "
          f"{cli.batch_size * cli.max_completion_length} prompt-tokens per member step)")  # fmt: skip
    settings = {key: value for key, value in vars(cli).items() if key != "worker"}
    result = {"benchmark": "bench", "machine": machine, "settings": {**settings, "parameters": parameters}}
    result.update(dict.fromkeys(REQUIRED_KEYS))
    skipped = {}

    def section(name: str, measure):
        if name not in sections:
            skipped[name] = "not among --sections"
            return None
        outcome = measure()
        if "skipped" in outcome:
            print(f"skipped: {outcome['skipped']}")
            skipped[name] = outcome["skipped"]
        result[name] = outcome
        return outcome

    memory = section("memory", lambda: memory_section(cli, paths, device))
    if memory:
        for key in MEMORY_KEYS:
            result[key] = memory[key]
    speed = section("speed", lambda: speed_section(cli, paths[cli.memory_model], device))
    if speed:
        for key in ("overhead_ratio_es_over_generation", "overhead_ratio_es_over_generation_small_batch",
                    "overhead_crosses_1_05_at_prompt_tokens"):  # fmt: skip
            result[key] = speed[key]
        result["overhead_ratio_own_work"] = speed["users_regime"]["overhead_ratio_own_work"]
    if memory and speed and "float32" in memory["setups"]:  # GRPO's step from its float32 memory run (not interleaved)
        grpo_step = memory["setups"]["float32"]["grpo"]["step_seconds"][-1]
        ratio = speed["users_regime"]["median_seconds"]["es_step"] / grpo_step
        result["time_ratio_es_over_grpo_per_step"] = result["time_ratio_es_over_grpo_per_completion"] = ratio
        print(
            f"time_ratio_es_over_grpo_per_step = {ratio:.3f} (GRPO's last step in its float32 memory run: "
            f"{grpo_step:.2f} s; the same N x B completions per step, so per completion too)"
        )
    lowrank = section("lowrank", lambda: lowrank_section(cli, paths[cli.lowrank_model], device))
    if lowrank:
        result["lowrank_ratio_over_batched_generation"] = lowrank["lowrank_ratio_over_batched_generation"]
        for row in lowrank["rows"]:
            n = row["population_size"]
            result[f"lowrank_ratio_es_over_generation_n{n}"] = row["lowrank_over_plain_generation"]
            if "fullrank_over_plain_generation" in row:
                result[f"fullrank_ratio_es_over_batched_generation_n{n}"] = row["fullrank_over_plain_generation"]
    vllm = section("vllm", lambda: vllm_section(cli, device))
    if vllm and "skipped" not in vllm:
        result["vllm_overhead_ratio"] = result["overhead_ratio_es_over_generation_vllm"] = vllm["vllm_overhead_ratio"]
        result["vllm_overhead_ratio_own_work"] = vllm["overhead_ratio_own_work"]
    processes = section("processes", lambda: processes_section(cli, paths[cli.processes_model], device))
    if processes and "skipped" not in processes:
        result["speedup_2_processes"] = processes["speedup_2_processes"]
        result["speedup_2_processes_unsharded_update"] = processes["speedup_2_processes_unsharded_update"]
    section("scale", lambda: scale_section(cli, paths, device))
    result["skipped"] = skipped
    result["elapsed_seconds"] = time.perf_counter() - started

    print(f"\n== Summary (elapsed {result['elapsed_seconds']:.0f} s) ==")
    for key, setting in REQUIRED_KEYS.items():
        value = result[key]
        shown = f"{value:.3f}" if isinstance(value, float) else "null"
        print(f"{key:48s}{shown:>8s}  {setting}")
    for key in ("overhead_ratio_own_work", "vllm_overhead_ratio_own_work", "time_ratio_es_over_grpo_per_step",
                "overhead_crosses_1_05_at_prompt_tokens", "speedup_2_processes_unsharded_update"):  # fmt: skip
        if result.get(key) is not None:
            print(f"{key:48s}{result[key]:8.3f}")
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason.splitlines()[0][:200]}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
