"""The coverage lab: base, ES, GRPO, ES→GRPO and GRPO→ES on the embedded arithmetic model, at equal completion budgets.

`make lab` (`python -m experiments.coverage_lab` from the repository root) trains every method from the model in
`trl_es/demo/model` on the offline task (`trl_es.tasks.arithmetic`) for several seeds and measures, on held-out
problems: greedy accuracy, Pass@k and Maj@k from 16 samples at temperature 1, token entropy
(`trl_es.evaluation.coverage`), the relative parameter shift from the base
(`trl_es.evaluation.analysis.parameter_shift`), the JS diversity of the ES population at the start and end of ES
(`trl_es.evaluation.metrics.js_diversity`), and Pass@1 of sparsified ES checkpoints
(`trl_es.evaluation.analysis.sparsify`). It writes `results.json`, PNG plots and a Markdown report.

ES runs with the demo's settings (`trl_es.demo.run.DemoSettings`) and every model is measured with the demo's
`held_out_report`.

The budget is counted in completions: an ES step costs `population_size x prompts` completions (every member answers
the same prompts greedily), a GRPO step `prompts x num_generations`. Each (method, seed) is one job; jobs run in
worker processes (one torch thread each) and cache their result in `work_dir`, so an interrupted lab resumes.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path

import torch
from transformers import TrainerCallback

from trl_es.core.noise import Member, derive_seed
from trl_es.demo.run import DEMO, DEMO_MODEL, PASS_AT_K, held_out_report
from trl_es.evaluation.metrics import js_diversity, pass_at_k
from trl_es.tasks.arithmetic import arithmetic_dataset, arithmetic_reward, extract_answer

METHODS = ("base", "es", "grpo", "es-then-grpo", "grpo-then-es")
LABELS = {"base": "base", "es": "ES", "grpo": "GRPO", "es-then-grpo": "ES→GRPO", "grpo-then-es": "GRPO→ES"}
ALL_KS = tuple(range(1, 17))
MAJ_KS = (1, 2, 4, 16)  # Maj@8 is left out: 10,000 sampled 8-subsets per problem cost more than the rest of an eval
SPARSITY_PERCENTS = (50, 78, 90)
WORKERS = 2  # worker processes of a full run (one with --quick)


@dataclass
class LabSettings:
    """Everything a lab run depends on; saved in the JSON. Defaults are the full run."""

    seeds: tuple[int, ...] = (0, 1, 2)
    # ES: the demo's settings (`trl_es.demo.run.DEMO`), but 3/10 of its steps by default: at the demo's budget one
    # GRPO run costs ~25 min on one thread of our 2-core machine (3.8 s per 512-completion step), too long for
    # 3 seeds x 4 trained methods in the lab's ~40 min.
    es_steps: int = DEMO.max_steps * 3 // 10
    population_size: int = DEMO.population_size
    sigma: float = DEMO.sigma
    es_learning_rate: float = DEMO.learning_rate
    prompts_per_step: int = DEMO.prompts_per_step
    max_completion_length: int = DEMO.max_completion_length
    # GRPO: `prompts_per_step` prompts x `num_generations` samples at temperature 1; steps follow from the budget.
    num_generations: int = 8
    grpo_learning_rate: float | None = None  # None: chosen by the sweep below, on training reward only
    grpo_lr_sweep: tuple[float, ...] = (1e-4, 3e-4, 1e-3, 3e-3)
    sweep_steps: int = 20  # steps of each sweep run (with the full run's schedule), judged on their last 10 rewards
    # Held-out evaluation (the test split, never trained on), as the demo's.
    num_held_out: int = DEMO.num_held_out
    samples_per_prompt: int = max(PASS_AT_K)
    num_sparse_held_out: int = 256
    js_problems: int = 64
    js_samples: int = 8
    js_population: int = 16
    num_train: int = DEMO.num_train
    logging_steps: int = 5
    eval_seed: int = DEMO.eval_seed

    @property
    def completions_per_es_step(self) -> int:
        return self.population_size * self.prompts_per_step

    @property
    def completions_per_grpo_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    @property
    def budget(self) -> int:
        """Completions per method and seed."""
        return self.es_steps * self.completions_per_es_step

    @property
    def grpo_steps(self) -> int:
        steps, remainder = divmod(self.budget, self.completions_per_grpo_step)
        if remainder or self.es_steps % 2 or steps % 2:
            raise ValueError(
                f"The budget of {self.budget} completions does not split into whole, even numbers of ES steps "
                f"({self.completions_per_es_step} completions) and GRPO steps ({self.completions_per_grpo_step})."
            )
        return steps


def quick_settings(seeds: tuple[int, ...] = (0,)) -> LabSettings:
    """A smoke-test lab: a few steps and problems, to check the pipeline end to end in a minute or two."""
    return LabSettings(
        seeds=seeds,
        es_steps=2,
        population_size=4,
        prompts_per_step=8,
        num_generations=4,
        grpo_lr_sweep=(1e-4, 1e-3),
        sweep_steps=1,
        num_held_out=16,
        num_sparse_held_out=8,
        js_problems=4,
        js_samples=4,
        js_population=4,
        num_train=64,
        logging_steps=1,
    )


# Training


class LogHistoryRecorder(TrainerCallback):
    """Writes the trainer's `log_history` to `<output_dir>/log_history.json` when training ends (the lab saves no
    Trainer checkpoints, so there is no trainer_state.json to read it from)."""

    def on_train_end(self, args, state, control, **kwargs):
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.output_dir) / "log_history.json").write_text(json.dumps(state.log_history))


class StopAfter(TrainerCallback):
    """Stops training after `steps` optimizer steps, leaving the learning-rate schedule of the full run."""

    def __init__(self, steps: int):
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.steps:
            control.should_training_stop = True


def es_config(settings: LabSettings, output_dir: str, steps: int, seed: int):
    """The demo's ESConfig (`trl_es.demo.run.DemoSettings.es_config`: greedy, on CPU, no checkpoints) with the lab's
    N, σ, α, prompts per step, completion length and logging, for `steps` steps."""
    demo = replace(
        DEMO,
        max_steps=steps,
        population_size=settings.population_size,
        sigma=settings.sigma,
        learning_rate=settings.es_learning_rate,
        prompts_per_step=settings.prompts_per_step,
        max_completion_length=settings.max_completion_length,
        logging_steps=settings.logging_steps,
    )
    return demo.es_config(output_dir, seed, disable_tqdm=True)


def grpo_config(settings: LabSettings, output_dir: str, steps: int, seed: int, learning_rate: float):
    """GRPOConfig with `prompts_per_step x num_generations` completions per step at temperature 1 (AdamW, beta=0,
    TRL's default loss and linear schedule), float32 on CPU."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=settings.completions_per_grpo_step,
        num_generations=settings.num_generations,
        max_completion_length=settings.max_completion_length,
        temperature=1.0,
        learning_rate=learning_rate,
        max_steps=steps,
        logging_steps=settings.logging_steps,
        save_strategy="no",
        report_to=[],
        seed=seed,
        bf16=False,
        use_cpu=True,
        disable_tqdm=True,
    )


def train_stages(settings: LabSettings, method: str, seed: int, output_dir: Path, grpo_lr: float) -> Path:
    """Train `method` ("es", "grpo", "es-then-grpo", "grpo-then-es") from the demo model with SequentialTrainer;
    returns the final model's folder. Sequential methods spend half the budget in each stage."""
    from trl_es.sequential.trainer import SequentialTrainer

    half = method in ("es-then-grpo", "grpo-then-es")
    es_steps = settings.es_steps // 2 if half else settings.es_steps
    grpo_steps = settings.grpo_steps // 2 if half else settings.grpo_steps
    es_stage = es_config(settings, str(output_dir), es_steps, seed)
    grpo_stage = grpo_config(settings, str(output_dir), grpo_steps, seed, grpo_lr)
    stages = {
        "es": [es_stage],
        "grpo": [grpo_stage],
        "es-then-grpo": [es_stage, grpo_stage],
        "grpo-then-es": [grpo_stage, es_stage],
    }[method]
    trainer = SequentialTrainer(
        model=str(DEMO_MODEL),
        stages=stages,
        output_dir=str(output_dir),
        reward_funcs=arithmetic_reward,
        train_dataset=arithmetic_dataset("train", settings.num_train),
        callbacks=[LogHistoryRecorder()],
    )
    return trainer.train()


def reward_curve(settings: LabSettings, run_dir: Path, method: str) -> dict[str, list[float]]:
    """Training reward against completions spent, over the stages of a run: ES logs the mean member reward, GRPO the
    mean reward of its sampled completions (both as `reward`, averaged over each logging window)."""
    completions, rewards, spent = [], [], 0
    for stage_dir in sorted(run_dir.glob("stage-*"), key=lambda path: int(path.name.split("-")[1])):
        per_step = (
            settings.completions_per_es_step if stage_dir.name.endswith("-es") else settings.completions_per_grpo_step
        )
        history = json.loads((stage_dir / "log_history.json").read_text())
        points = [(entry["step"], entry["reward"]) for entry in history if "reward" in entry]
        completions += [spent + step * per_step for step, _ in points]
        rewards += [reward for _, reward in points]
        spent += max((entry.get("step", 0) for entry in history), default=0) * per_step
    return {"completions": completions, "reward": rewards}


def sweep_grpo_learning_rate(settings: LabSettings, learning_rate: float, seed: int, work_dir: Path) -> dict:
    """`sweep_steps` GRPO steps at `learning_rate` (with the full run's schedule): the mean training reward of the
    last 10 logged steps, and the curve. Held-out problems play no part."""
    from accelerate.state import AcceleratorState
    from trl import GRPOTrainer

    output_dir = work_dir / f"sweep-lr{learning_rate:g}"
    args = grpo_config(settings, str(output_dir), settings.grpo_steps, seed, learning_rate)
    args.logging_steps = 1
    trainer = GRPOTrainer(
        model=str(DEMO_MODEL),
        reward_funcs=arithmetic_reward,
        args=args,
        train_dataset=arithmetic_dataset("train", settings.num_train),
        callbacks=[StopAfter(settings.sweep_steps)],
    )
    trainer.train()
    AcceleratorState._reset_state()  # the next trainer in this process builds its own Accelerator
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return {"learning_rate": learning_rate, "rewards": rewards, "final_reward": statistics.fmean(rewards[-10:])}


# Measurements


def load_model(path: str | Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)


def held_out_metrics(settings: LabSettings, model_dir: str | Path, num_problems: int | None = None) -> dict:
    """The demo's `held_out_report` on the first `num_problems` test problems (`samples_per_prompt` samples at
    temperature 1), with Pass@k for every k from 1 to `samples_per_prompt` from the per-problem success counts."""
    model, tokenizer = load_model(model_dir)
    report = held_out_report(
        model,
        tokenizer,
        num_problems or settings.num_held_out,
        ks=MAJ_KS,
        samples_per_prompt=settings.samples_per_prompt,
        max_new_tokens=settings.max_completion_length,
        seed=settings.eval_seed,
    )
    n = settings.samples_per_prompt
    counts = [round(p * n) for p in report.success_probs]
    ks = [k for k in ALL_KS if k <= n]
    return {
        "greedy_accuracy": report.greedy_accuracy,
        "pass@k": {k: sum(pass_at_k(n, c, k) for c in counts) / len(counts) for k in ks},
        "maj@k": dict(report.maj_at_k),
        "entropy": report.token_entropy,
        "success_probs": report.success_probs,
        "num_problems": report.num_prompts,
    }


@torch.no_grad()
def population_js_diversity(settings: LabSettings, model_dir: str | Path, seed: int) -> dict:
    """JS diversity of an ES population around the model in `model_dir`: `js_population` members θ + σε (seeded
    from `seed`) each sample `js_samples` answers at temperature 1 to `js_problems` held-out problems (the same
    sampling seed for every member); per-problem member success rates → `js_diversity`, averaged over problems."""
    from trl_es.core.master import MasterWeights
    from trl_es.evaluation.coverage import TransformersSampler

    model, tokenizer = load_model(model_dir)
    parameters = dict(model.named_parameters())
    master = MasterWeights(parameters, settings.sigma)
    test = arithmetic_dataset("test", settings.js_problems)
    prompt_ids = [tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in test["prompt"]]
    sampler = TransformersSampler(model, tokenizer)
    success = []  # success[member][problem]
    for index in range(settings.js_population):
        for name, value in master.perturbed(Member(derive_seed("lab-js", seed, index))):
            parameters[name].copy_(value)
        completions = sampler.sample(
            prompt_ids, settings.js_samples, 1.0, settings.max_completion_length, settings.eval_seed
        )
        success.append(
            [
                statistics.fmean(extract_answer(text) == answer for text in tokenizer.batch_decode(ids, True))
                for ids, answer in zip(completions, test["answer"], strict=True)
            ]
        )
    per_problem = [js_diversity([member[i] for member in success]) for i in range(len(prompt_ids))]
    return {
        "js_diversity": statistics.fmean(per_problem),
        "mean_success": statistics.fmean(p for member in success for p in member),
    }


def sparsified_metrics(settings: LabSettings, tuned_dir: Path, work_dir: Path) -> dict:
    """Pass@1 and greedy accuracy (on `num_sparse_held_out` problems) of `tuned_dir` with the p% smallest |Δθ| reset
    to the base, for p in SPARSITY_PERCENTS, and of the dense model on the same problems."""
    from trl_es.evaluation.analysis import sparsify

    results = {}
    paths = sparsify(DEMO_MODEL, tuned_dir, SPARSITY_PERCENTS, work_dir)
    for percent, path in zip((0, *SPARSITY_PERCENTS), (tuned_dir, *paths), strict=True):
        metrics = held_out_metrics(settings, path, settings.num_sparse_held_out)
        results[percent] = {"pass@1": metrics["pass@k"][1], "greedy_accuracy": metrics["greedy_accuracy"]}
    return results


# Jobs


@dataclass
class Job:
    """One unit of work, run in a worker process: `kind` is "base", "sweep" or a trained method."""

    kind: str
    seed: int = 0
    learning_rate: float = 0.0  # the sweep's, or GRPO's for a method with a GRPO stage
    work_dir: str = ""
    settings: LabSettings = field(default_factory=LabSettings)
    threads: int = 1

    @property
    def name(self) -> str:
        if self.kind == "base":
            return "base"
        if self.kind == "sweep":
            return f"sweep-lr{self.learning_rate:g}"
        return f"{self.kind}-seed{self.seed}"


def run_job(job: Job) -> dict:
    """Run one job (or read its cached result): train, then measure; returns the result and caches it as JSON."""
    folder = Path(job.work_dir) / job.name
    cached = folder / "result.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    torch.set_num_threads(job.threads)
    started = time.time()
    settings = job.settings
    folder.mkdir(parents=True, exist_ok=True)
    if job.kind == "sweep":
        result = sweep_grpo_learning_rate(settings, job.learning_rate, settings.seeds[0], folder)
    elif job.kind == "base":
        result = {"held_out": held_out_metrics(settings, DEMO_MODEL), "shift": 0.0}
    else:
        result = train_and_measure(job, folder)
    result["runtime_s"] = time.time() - started
    result = json.loads(json.dumps(result))  # the same key types (strings) whether fresh or read from the cache
    cached.write_text(json.dumps(result))
    gc.collect()
    return result


def train_and_measure(job: Job, folder: Path) -> dict:
    """Train one method for one seed and measure it: held-out metrics, shift, reward curve; for ES also the
    population's JS diversity before and after and the sparsified checkpoints; for GRPO→ES the JS diversity around
    the GRPO checkpoint (start of its ES stage) and at the end."""
    from trl_es.evaluation.analysis import parameter_shift

    settings = job.settings
    final = train_stages(settings, job.kind, job.seed, folder / "run", job.learning_rate)
    result = {
        "held_out": held_out_metrics(settings, final),
        "shift": parameter_shift(DEMO_MODEL, final).relative_l2,
        "curve": reward_curve(settings, folder / "run", job.kind),
    }
    if job.kind in ("es", "grpo-then-es"):
        start = DEMO_MODEL if job.kind == "es" else folder / "run" / "stage-0-grpo" / "final"
        result["js_diversity"] = {
            "start": population_js_diversity(settings, start, job.seed),
            "end": population_js_diversity(settings, final, job.seed),
        }
    if job.kind == "es":
        result["sparsity"] = sparsified_metrics(settings, final, folder / "sparse")
    return result


def run_jobs(jobs: list[Job], workers: int, log=print) -> list[dict]:
    """Run `jobs` in `workers` spawned processes (in this process when `workers` is 1), in order of submission."""
    if workers <= 1:
        results = []
        for job in jobs:
            log(f"[lab] {job.name} ...")
            results.append(run_job(job))
            log(f"[lab] {job.name} done in {results[-1]['runtime_s']:.0f} s")
        return results
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_job, job) for job in jobs]
        results = []
        for job, future in zip(jobs, futures, strict=True):
            results.append(future.result())
            log(f"[lab] {job.name} done in {results[-1]['runtime_s']:.0f} s")
        return results


# Summaries


def spread(values: list[float]) -> dict:
    """Mean, sample standard deviation (0 for one value) and the values themselves."""
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "values": values,
    }


def method_metrics(result: dict) -> dict[str, float]:
    """The flat metrics of one (method, seed) result that the summary aggregates."""
    held_out = result["held_out"]
    metrics = {
        "greedy_accuracy": held_out["greedy_accuracy"],
        "entropy": held_out["entropy"],
        "shift": result["shift"],
    }
    metrics |= {f"pass@{k}": value for k, value in held_out["pass@k"].items()}
    metrics |= {f"maj@{k}": value for k, value in held_out["maj@k"].items()}
    return metrics


def summarize_runs(runs: dict[str, dict[int, dict]]) -> dict[str, dict[str, dict]]:
    """`summary[method][metric] = spread over seeds`, including JS diversity and sparsity where measured."""
    summary = {}
    for method, by_seed in runs.items():
        per_seed = [method_metrics(result) for result in by_seed.values()]
        summary[method] = {name: spread([m[name] for m in per_seed]) for name in per_seed[0]}
        if all("js_diversity" in result for result in by_seed.values()):
            for moment in ("start", "end"):
                for key in ("js_diversity", "mean_success"):
                    values = [result["js_diversity"][moment][key] for result in by_seed.values()]
                    summary[method][f"{key}/{moment}"] = spread(values)
        if all("sparsity" in result for result in by_seed.values()):
            for percent in next(iter(by_seed.values()))["sparsity"]:
                for key in ("pass@1", "greedy_accuracy"):
                    values = [result["sparsity"][percent][key] for result in by_seed.values()]
                    summary[method][f"sparse-{percent}/{key}"] = spread(values)
    return summary


def machine_info() -> dict:
    """What the numbers were measured on."""
    import transformers
    import trl

    return {
        "nproc": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "load_average_at_start": load_average(),
    }


def load_average() -> tuple[float, float, float] | None:
    """The 1-, 5- and 15-minute load averages, or None where the platform does not give them (`os.getloadavg` is
    missing, or raises OSError)."""
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


# Plots and report


def plot_pass_at_k_with_spread(summary: dict, path: Path) -> Path:
    """Pass@k against k (log2 axis) for every method: the mean over seeds with ±1 std error bars."""
    from trl_es.evaluation.plots import pyplot, save_figure

    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6.5, 4.5))
    for method, metrics in summary.items():
        ks = sorted(int(name[5:]) for name in metrics if name.startswith("pass@"))
        means = [metrics[f"pass@{k}"]["mean"] for k in ks]
        stds = [metrics[f"pass@{k}"]["std"] for k in ks]
        axes.errorbar(ks, means, yerr=stds, marker="o", markersize=3, capsize=3, label=LABELS[method])
    axes.set_xscale("log", base=2)
    axes.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
    axes.set_xlabel("k (samples at temperature 1)")
    axes.set_ylabel("held-out Pass@k")
    axes.set_title("Pass@k at equal completion budgets (mean ± std over seeds)")
    axes.grid(alpha=0.3)
    axes.legend()
    return save_figure(figure, path)


def plot_reward_curves(runs: dict[str, dict[int, dict]], sweep: list[dict], settings: LabSettings, path: Path) -> Path:
    """Training reward against completions spent, one line per method and seed; and the GRPO learning-rate sweep."""
    from trl_es.evaluation.plots import pyplot, save_figure

    plt = pyplot()
    figure, (curves_axes, sweep_axes) = plt.subplots(2, 1, figsize=(7, 8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for color, (method, by_seed) in zip(colors[1:], runs.items(), strict=False):
        # ES on top and dashed: with the same seed, ES→GRPO's ES stage repeats the first half of the ES run exactly.
        style = {"linestyle": "--", "zorder": 3, "linewidth": 1.5} if method == "es" else {"linewidth": 1}
        for index, result in enumerate(by_seed.values()):
            curve = result["curve"]
            label = LABELS[method] if index == 0 else None
            curves_axes.plot(curve["completions"], curve["reward"], color=color, alpha=0.8, label=label, **style)
    curves_axes.axvline(settings.budget / 2, color="grey", linestyle=":", linewidth=1)
    curves_axes.set_xlabel("completions spent")
    curves_axes.set_ylabel("training reward")
    curves_axes.set_title("Training reward, one line per seed\n(ES: mean member reward, greedy; GRPO: samples at T=1)")
    curves_axes.grid(alpha=0.3)
    curves_axes.legend()
    for entry in sweep:
        steps = range(1, len(entry["rewards"]) + 1)
        sweep_axes.plot(steps, entry["rewards"], label=f"lr={entry['learning_rate']:g}")
    sweep_axes.set_xlabel("GRPO step (sweep, seed 0)")
    sweep_axes.set_ylabel("training reward")
    sweep_axes.set_title("GRPO learning-rate sweep (judged on training reward only)")
    sweep_axes.grid(alpha=0.3)
    sweep_axes.legend()
    return save_figure(figure, path)


def _cell(stat: dict, digits: int = 3) -> str:
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def _shift_cell(stat: dict) -> str:
    return f"{stat['mean']:.2e} ± {stat['std']:.1e}"


def render_markdown(results: dict, markdown_path: Path, plots: dict[str, Path]) -> str:
    """The Markdown report: settings, machine, command, the tables and the plots (relative links)."""
    settings, summary, runs = results["settings"], results["summary"], results["runs"]
    seeds = settings["seeds"]
    link = {name: os.path.relpath(path, markdown_path.parent) for name, path in plots.items()}
    machine = results["machine"]
    load = machine.get("load_average_at_start")
    lines = [
        "# The coverage lab: ES, GRPO and their sequences on the embedded arithmetic model",
        "",
        "Base, ES, GRPO, ES→GRPO and GRPO→ES, each trained from `trl_es/demo/model` on the offline arithmetic task "
        "(`trl_es.tasks.arithmetic`, reward 1 when the first number of the answer is right) with the same number of "
        f"completions, for seeds {', '.join(map(str, seeds))}; measured on the first {settings['num_held_out']} "
        f"problems of the held-out test split ({settings['samples_per_prompt']} samples per problem at temperature 1; "
        "greedy accuracy from one greedy answer). Cells are mean ± sample std over seeds; per-seed values are below "
        "and in the JSON.",
        "",
        "Reproduce (all files are rewritten; per-job results are cached in `--work_dir` and reused):",
        "",
        "```bash",
        results["command"],
        "```",
        "",
        f"Machine: {machine['nproc']} CPU cores (`nproc`), {machine['processor']}, {machine['platform']}, Python "
        f"{machine['python']}, torch {machine['torch']}, transformers {machine['transformers']}, "
        f"TRL {machine['trl']}. {results['workers']} worker processes with {results['threads']} torch thread each; "
        "the cores were shared with other jobs (load average "
        f"{f'{load[0]:.1f}' if load else 'unavailable'} at the start). "
        f"Wall time: {results['runtime_s'] / 60:.1f} min.",
        "",
        "## Settings",
        "",
        f"- Budget per method and seed: **{results['budget']:,} completions** of at most "
        f"{settings['max_completion_length']} tokens.",
        f"- ES (the demo's settings): N={settings['population_size']}, σ={settings['sigma']}, "
        f"α={settings['es_learning_rate']}, {settings['prompts_per_step']} prompts per step answered greedily by "
        f"every member ({settings['population_size'] * settings['prompts_per_step']} completions per step), "
        f"{settings['es_steps']} steps"
        + (
            f" (the demo runs {DEMO.max_steps}: the lab's budget is {settings['es_steps'] / DEMO.max_steps:.0%} "
            "of the demo's so that 3 seeds of every method fit in about 40 min on 2 CPU cores; GRPO's backward pass "
            "makes its completions ~3x dearer than ES's greedy ones)."
            if settings["es_steps"] != DEMO.max_steps
            else "."
        ),
        f"- GRPO: {settings['prompts_per_step']} prompts × {settings['num_generations']} generations = "
        f"{settings['prompts_per_step'] * settings['num_generations']} completions per step at temperature 1, "
        f"{results['grpo_steps']} steps, AdamW at lr={results['grpo_learning_rate']:g} with TRL's default linear "
        "decay, beta=0, TRL's default loss (`dapo`), float32.",
        f"- ES→GRPO and GRPO→ES: half the budget in each stage ({settings['es_steps'] // 2} ES steps, "
        f"{results['grpo_steps'] // 2} GRPO steps), `SequentialTrainer`, each stage from the previous one's model.",
        "",
    ]
    sweep = results["grpo_lr_sweep"]
    if sweep:
        lines += [
            "### GRPO learning rate",
            "",
            f"Sweep: {settings['sweep_steps']} GRPO steps per learning rate (seed {seeds[0]}, the full run's "
            "schedule), judged on the mean **training** reward of the last 10 steps (held-out problems play no part):",
            "",
            "| lr | training reward (last 10 steps) |",
            "|---|---|",
            *[f"| {entry['learning_rate']:g} | {entry['final_reward']:.3f} |" for entry in sweep],
            "",
            f"Chosen: lr={results['grpo_learning_rate']:g}."
            + (
                " It is at the edge of the grid, so a learning rate beyond it might train faster still (or diverge "
                "over the full run): the sweep did not bracket the best value."
                if results["grpo_learning_rate"]
                in (min(e["learning_rate"] for e in sweep), max(e["learning_rate"] for e in sweep))
                else ""
            ),
            "",
        ]
    ks = [1, 2, 4, 8, 16]
    maj_ks = [k for k in MAJ_KS if k > 1]
    header = ["method", "greedy", *[f"Pass@{k}" for k in ks], *[f"Maj@{k}" for k in maj_ks], "entropy", "‖Δθ‖/‖θ‖"]
    lines += [
        "## Results",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for method, metrics in summary.items():
        cells = [LABELS[method], _cell(metrics["greedy_accuracy"])]
        cells += [_cell(metrics[f"pass@{k}"]) for k in ks]
        cells += [_cell(metrics[f"maj@{k}"]) for k in maj_ks]
        cells += [_cell(metrics["entropy"]), _shift_cell(metrics["shift"]) if method != "base" else "0"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Entropy: mean token entropy (nats) of the sampled answers. ‖Δθ‖/‖θ‖: relative L2 distance of all weights "
        "from the base (`trl_es.evaluation.analysis.parameter_shift`). The base model is measured once (its "
        f"evaluation uses the fixed sampling seed {settings['eval_seed']}), so its std is 0. The standard error of "
        f"one accuracy on {settings['num_held_out']} problems is about "
        f"{math.sqrt(0.25 / settings['num_held_out']):.3f}.",
        "",
        f"![Pass@k of the five methods]({link['pass_at_k']})",
        "",
        "### Per seed",
        "",
        "| method | seed | greedy | Pass@1 | Pass@16 | Maj@16 | entropy | ‖Δθ‖/‖θ‖ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, by_seed in runs.items():
        for seed, result in by_seed.items():
            m = method_metrics(result)
            lines.append(
                f"| {LABELS[method]} | {seed} | {m['greedy_accuracy']:.3f} | {m['pass@1']:.3f} | {m['pass@16']:.3f} "
                f"| {m['maj@16']:.3f} | {m['entropy']:.3f} | {m['shift']:.2e} |"
            )
    lines += [
        "",
        "## Population JS diversity",
        "",
        f"Around a model θ: {settings['js_population']} members θ + σε (σ={settings['sigma']}) each sample "
        f"{settings['js_samples']} answers at temperature 1 to {settings['js_problems']} held-out problems; the "
        "members' per-problem success rates give the verifier-projected JS diversity (bits, "
        "`trl_es.evaluation.metrics.js_diversity`), averaged over problems. Measured at the start and end of ES (the "
        "demo's ES decodes greedily with one completion per prompt, so training logs no diversity). For GRPO→ES the "
        "start is the GRPO checkpoint.",
        "",
        "| run | JS at start | JS at end | member success at start | member success at end |",
        "|---|---|---|---|---|",
    ]
    for method, metrics in summary.items():
        if "js_diversity/start" in metrics:
            start_label = "base" if method == "es" else "GRPO half"
            lines.append(
                f"| {LABELS[method]} (start: {start_label}) | {_cell(metrics['js_diversity/start'], 4)} | "
                f"{_cell(metrics['js_diversity/end'], 4)} | {_cell(metrics['mean_success/start'])} | "
                f"{_cell(metrics['mean_success/end'])} |"
            )
    es = summary.get("es", {})
    if "sparse-0/pass@1" in es or any(name.startswith("sparse-") for name in es):
        lines += [
            "",
            "## Sparsified ES checkpoints",
            "",
            "The ES model with the p% smallest |Δθ| reset to the base (`trl_es.evaluation.analysis.sparsify`, global "
            f"threshold), measured on the first {settings['num_sparse_held_out']} held-out problems (p=0: the dense "
            "ES model on the same problems).",
            "",
            "| p (% of coordinates reset) | Pass@1 | greedy | per-seed Pass@1 |",
            "|---|---|---|---|",
        ]
        for percent in (0, *SPARSITY_PERCENTS):
            key = f"sparse-{percent}"
            if f"{key}/pass@1" in es:
                values = ", ".join(f"{v:.3f}" for v in es[f"{key}/pass@1"]["values"])
                lines.append(
                    f"| {percent} | {_cell(es[f'{key}/pass@1'])} | {_cell(es[f'{key}/greedy_accuracy'])} | {values} |"
                )
    lines += [
        "",
        "## Training curves",
        "",
        "Reward against completions spent (ES: mean member reward over its greedy answers; GRPO: mean reward of its "
        "samples at temperature 1, so the two are not the same measurement; the dotted line is the hand-over of the "
        "sequential runs; ES is dashed because ES→GRPO's ES stage, with the same seed and a constant step size, "
        "repeats the first half of the ES run exactly). Below: the GRPO learning-rate sweep.",
        "",
        f"![Training reward curves]({link['curves']})",
        "",
        "## Runtime",
        "",
        "| job | seconds |",
        "|---|---|",
        *[f"| {name} | {seconds:.0f} |" for name, seconds in results["job_runtimes_s"].items()],
        "",
        "All numbers: `" + os.path.relpath(plots["json"], markdown_path.parent) + "`.",
        "",
    ]
    return "\n".join(lines)


# Entry point


def run_lab(
    settings: LabSettings,
    output_dir: Path,
    markdown_path: Path,
    work_dir: Path,
    workers: int = WORKERS,
    threads: int = 1,
    command: str = "",
    log=print,
) -> dict:
    """Sweep GRPO's learning rate (unless given), train and measure every method and seed, write JSON, plots and
    Markdown; returns the results."""
    started = time.time()
    machine = machine_info()
    settings.grpo_steps  # noqa: B018 -- fails early when the budget does not split into whole steps
    jobs = [Job("base", work_dir=str(work_dir), settings=settings, threads=threads)]
    sweep = []
    grpo_lr = settings.grpo_learning_rate
    if grpo_lr is None:
        sweep_jobs = [
            Job("sweep", learning_rate=lr, work_dir=str(work_dir), settings=settings, threads=threads)
            for lr in settings.grpo_lr_sweep
        ]
        sweep = run_jobs(sweep_jobs, workers, log)
        grpo_lr = max(sweep, key=lambda entry: entry["final_reward"])["learning_rate"]
        log(f"[lab] GRPO learning rate from the sweep: {grpo_lr:g}")
    methods = [method for method in METHODS if method != "base"]
    # The longest jobs first, so that the workers finish together.
    order = ["grpo", "es-then-grpo", "grpo-then-es", "es"]
    jobs += [
        Job(method, seed, grpo_lr, str(work_dir), settings, threads)
        for method in order
        for seed in settings.seeds
        if method in methods
    ]
    job_results = dict(zip((job.name for job in jobs), run_jobs(jobs, workers, log), strict=True))
    runs = {"base": {seed: job_results["base"] for seed in settings.seeds[:1]}}
    runs |= {method: {seed: job_results[f"{method}-seed{seed}"] for seed in settings.seeds} for method in methods}
    results = {
        "command": command,
        "machine": machine,
        "workers": workers,
        "threads": threads,
        "settings": asdict(settings),
        "budget": settings.budget,
        "grpo_steps": settings.grpo_steps,
        "grpo_learning_rate": grpo_lr,
        "grpo_lr_sweep": [{k: v for k, v in entry.items() if k != "runtime_s"} for entry in sweep],
        "summary": summarize_runs(runs),
        "runs": runs,
        "job_runtimes_s": {f"sweep-lr{entry['learning_rate']:g}": entry["runtime_s"] for entry in sweep}
        | {name: result["runtime_s"] for name, result in job_results.items()},
        "runtime_s": time.time() - started,
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    write_report(output_dir, markdown_path, log)
    return results


def write_report(output_dir: Path, markdown_path: Path, log=print) -> None:
    """Draw the plots and write the Markdown report from `output_dir/results.json` (no training: rerun it after
    changing a plot or the report's layout)."""
    results = json.loads((output_dir / "results.json").read_text())
    settings = LabSettings(**results["settings"])
    trained = {method: by_seed for method, by_seed in results["runs"].items() if method != "base"}
    plots = {
        "pass_at_k": plot_pass_at_k_with_spread(results["summary"], output_dir / "pass_at_k.png"),
        "curves": plot_reward_curves(trained, results["grpo_lr_sweep"], settings, output_dir / "reward_curves.png"),
        "json": output_dir / "results.json",
    }
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    markdown_path.write_text(render_markdown(results, markdown_path, plots))
    log(f"[lab] wrote {plots['json']}, {plots['pass_at_k']}, {plots['curves']} and {markdown_path}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    defaults, quick = LabSettings(), quick_settings()
    parser = argparse.ArgumentParser(prog="python -m experiments.coverage_lab", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seeds", type=int, default=len(defaults.seeds), help="Number of seeds (0, 1, ...; default %(default)s)."
    )
    parser.add_argument(
        "--output_dir", default="docs/lab", help="Where results.json and the PNGs go (default %(default)s)."
    )
    parser.add_argument("--markdown", default=None, help="The report (default: <output_dir>.md, e.g. docs/lab.md).")
    parser.add_argument(
        "--work_dir",
        default=None,
        help="Checkpoints and cached per-job results (default: <tmp>/trl-es-lab[-quick]); reused when rerun.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"A smoke test: {quick.es_steps} ES steps of {quick.population_size} members, "
        f"{quick.num_held_out} held-out problems, one worker.",
    )
    parser.add_argument(
        "--es_steps",
        type=int,
        default=None,
        help=f"ES steps (default {defaults.es_steps}, {quick.es_steps} with --quick; GRPO steps follow).",
    )
    parser.add_argument(
        "--grpo_learning_rate",
        type=float,
        default=None,
        help="Skip the sweep (default: the best of "
        + ", ".join(f"{lr:g}" for lr in defaults.grpo_lr_sweep)
        + " on training reward) and use this lr.",
    )
    parser.add_argument(
        "--workers", type=int, default=None, help=f"Worker processes (default {WORKERS}; 1 with --quick)."
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker (default %(default)s).")
    parser.add_argument(
        "--report_only", action="store_true", help="Redraw the plots and the report from <output_dir>/results.json."
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    seeds = tuple(range(args.seeds))
    settings = quick_settings(seeds) if args.quick else LabSettings(seeds=seeds)
    if args.es_steps is not None:
        settings = replace(settings, es_steps=args.es_steps)
    if args.grpo_learning_rate is not None:
        settings = replace(settings, grpo_learning_rate=args.grpo_learning_rate)
    output_dir = Path(args.output_dir)
    markdown = Path(args.markdown) if args.markdown else output_dir.with_suffix(".md")
    if args.report_only:
        write_report(output_dir, markdown)
        return json.loads((output_dir / "results.json").read_text())
    suffix = "-quick" if args.quick else ""
    work_dir = Path(args.work_dir or Path(tempfile.gettempdir()) / f"trl-es-lab{suffix}")
    workers = args.workers or (1 if args.quick else WORKERS)
    command = "python -m experiments.coverage_lab " + " ".join(
        shlex.quote(arg) for arg in (argv if argv is not None else sys.argv[1:])
    )
    return run_lab(settings, output_dir, markdown, work_dir, workers, args.threads, command.strip())


if __name__ == "__main__":
    main()
