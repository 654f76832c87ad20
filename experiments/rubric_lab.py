"""The rubric lab: EVOLM's variants and baselines at equal budgets, on the demo's joint model and its null control.

`make rubric-lab` (`python -m experiments.rubric_lab` from the repository root) trains every method from each
embedded model of the EVOLM demo (`trl_es/demo/evolm/`) for several seeds and measures, on held-out problems, with
the verifier (which only the `verifier` method also trains on): greedy accuracy, Pass@k, the right-reading rate
c/(c+m), the slip rate, the rubrics' correctness, genericity and validity, how often the greedy rubric makes the judge
separate the right answer from the misread one, and the judge's failure rate. It writes `results.json`, a plot and
a Markdown report (`docs/rubric_lab.md`).

Methods (`METHODS`):
- `base`: the pretrained model;
- `verifier`: ES on the verifier's reward, the upper bound (the only method that sees answers);
- `static`: policy phases only, on the starting model's rubrics;
- `coevolve-<pairs>`: EVOLM, policy and rubric phases alternating, with temporal, rubric-conditioned, inferred-question
  or mixed pairs and the demo's margin rubric reward; `coevolve-indicator`: temporal pairs with the indicator reward;
- `sequential`: all rubric phases (mixed inferred and rubric-conditioned pairs: no policy step has been taken, so no
  temporal pair exists), then all policy phases;
- `grpo`, `es-policy-grpo-rubric`, `grpo-policy-es-rubric`: coevolve-temporal with GRPO for one or both roles;
- `scalar-rm`: a Bradley–Terry reward model (the judge's architecture, from its weights, reading question and answer)
  trained on the model's own inferred-question and rubric-conditioned pairs, then ES on its reward: the paper's
  scalar-RM baseline; its held-out reward is reported beside the true accuracy, to show over-optimisation.

The budget is counted in completions plus judge (or reward-model) calls during training: an ES or GRPO policy step
costs `N x B` completions and as many judge calls, a rubric step `N x B` completions and twice as many calls (chosen
and rejected), a verifier step `N x B` completions only. Methods without rubric phases get the steps that spend the
same budget (`policy_steps_at_equal_budget`). Dataset building between phases (one answer and one rubric per training
question) and the reward model's training are not counted; both are small beside the training steps.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from experiments.coverage_lab import machine_info, spread
from trl_es.demo.evolm.settings import DEMO_MODELS, RUBRIC_MISREAD, EvolmDemoSettings

MIXED = {"temporal": 1.0, "inferred": 1.0, "rubric_conditioned": 1.0}
NO_TEMPORAL = {"inferred": 1.0, "rubric_conditioned": 1.0}
# method -> the demo settings it changes (EVOLM methods) or None (the others)
METHODS: dict[str, dict | None] = {
    "base": None,
    "verifier": None,
    "static": {"schedule": "static"},
    "coevolve-temporal": {"pair_weights": {"temporal": 1.0}},
    "coevolve-conditioned": {"pair_weights": {"rubric_conditioned": 1.0}},
    "coevolve-inferred": {"pair_weights": {"inferred": 1.0}},
    "coevolve-mixed": {"pair_weights": MIXED},
    "coevolve-indicator": {"pair_weights": {"temporal": 1.0}, "rubric_reward": "indicator"},
    "sequential": {"schedule": "sequential", "pair_weights": NO_TEMPORAL},
    "grpo": {"pair_weights": {"temporal": 1.0}, "policy_method": "grpo", "rubric_method": "grpo"},
    "es-policy-grpo-rubric": {"pair_weights": {"temporal": 1.0}, "rubric_method": "grpo"},
    "grpo-policy-es-rubric": {"pair_weights": {"temporal": 1.0}, "policy_method": "grpo"},
    "scalar-rm": None,
}
HEADLINE = ("greedy_accuracy", "pass@4", "right_reading", "slip_rate", "rubric_correct_sampled", "rubric_separation")


@dataclass
class RubricLabSettings:
    """Everything a lab run depends on; saved in the JSON. Defaults are the full run."""

    demo: EvolmDemoSettings = field(default_factory=EvolmDemoSettings)
    seeds: tuple[int, ...] = (0, 1, 2)
    models: tuple[str, ...] = ("joint", "null")
    methods: tuple[str, ...] = tuple(METHODS)
    rm_steps: int = 300  # Bradley-Terry training steps of the scalar reward model

    def policy_steps_at_equal_budget(self, judge_calls_per_completion: int) -> int:
        """Policy steps (in total) of a method without rubric phases that spend EVOLM's budget, when each completion
        costs `judge_calls_per_completion` calls besides itself (0: the verifier, 1: a judge or reward model)."""
        demo = self.demo
        policy, rubric = demo.completions_per_step("policy"), demo.completions_per_step("rubric")
        evolm = demo.rounds * (2 * policy * demo.policy_steps + 3 * rubric * demo.rubric_steps)
        return math.floor(evolm / ((1 + judge_calls_per_completion) * policy))


def quick_settings() -> RubricLabSettings:
    """A smoke test: short phases, one seed, few held-out problems."""
    demo = EvolmDemoSettings(policy_steps=4, rubric_steps=2, rounds=1, num_train=64, num_held_out=128)
    return RubricLabSettings(demo=demo, seeds=(0,), rm_steps=30)


# ----------------------------------------------------------------------------------------------------------------
# Training


def train_method(settings: RubricLabSettings, model: str, method: str, seed: int, folder: Path, judge) -> Path:
    """Train `method` from the embedded `model` (a name of `DEMO_MODELS`); returns the final model's folder."""
    from trl_es.demo.evolm.run import train_evolm

    start = DEMO_MODELS[model]
    if method == "base":
        return start
    if method == "verifier":
        return train_on_reward(settings, start, "verifier", seed, folder)
    if method == "scalar-rm":
        reward_model = train_reward_model(settings, start, seed, folder / "reward_model")
        return train_on_reward(settings, start, reward_model, seed, folder)
    demo = replace(settings.demo, **METHODS[method])
    if demo.schedule == "static":
        steps = settings.policy_steps_at_equal_budget(1)
        demo = replace(demo, policy_steps=math.ceil(steps / demo.rounds))
    return train_evolm(start, demo, str(folder / "run"), seed, judge=judge)


def train_on_reward(settings: RubricLabSettings, start: Path, reward, seed: int, folder: Path) -> Path:
    """ES on the policy prompts with the verifier's reward (`reward="verifier"`) or a reward model's, for the steps
    that spend EVOLM's budget."""
    from datasets import Dataset

    from trl_es import ESTrainer
    from trl_es.demo.evolm.toy import DEMO_PROMPTS
    from trl_es.tasks.arithmetic import arithmetic_reward, problem

    demo = settings.demo
    problems = [problem("train", index) for index in range(demo.num_train)]
    columns = {"prompt": [DEMO_PROMPTS.policy.format(question=p.question) for p in problems]}
    if reward == "verifier":
        columns["answer"] = [str(p.answer) for p in problems]
        reward_funcs, calls = arithmetic_reward, 0
    else:
        columns["question"] = [p.question for p in problems]
        reward_funcs, calls = reward_model_reward(reward), 1
    steps = settings.policy_steps_at_equal_budget(calls)
    trainer = ESTrainer(
        model=str(start),
        reward_funcs=reward_funcs,
        args=replace(demo, policy_method="es").role_config("policy", str(folder / "run"), steps, seed),
        train_dataset=Dataset.from_dict(columns),
    )
    trainer.train()
    trainer.save_model(str(folder / "run" / "final"))
    return folder / "run" / "final"


def rm_text(question: str, answer: str) -> str:
    return f"Question: {question}\nAnswer:{answer}"


def train_reward_model(settings: RubricLabSettings, start: Path, seed: int, folder: Path) -> Path:
    """A Bradley–Terry reward model from the judge's weights, on pairs built from `start`'s own outputs (inferred
    question and rubric-conditioned, as the `sequential` method's first rubric phase builds them)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from trl_es.core.noise import derive_seed
    from trl_es.demo.evolm.run import JUDGE_MODEL, sample_completions
    from trl_es.demo.evolm.toy import DEMO_PROMPTS, question_dataset
    from trl_es.evolm.pairs import PairMixture, ReplayBuffer

    demo = settings.demo
    policy, policy_tokenizer = AutoModelForCausalLM.from_pretrained(start).eval(), AutoTokenizer.from_pretrained(start)
    calls = iter(range(1_000_000))

    def generate(texts: list[str]) -> list[str]:  # sampled at temperature 1, as EvolmTrainer builds its pairs
        seed_of_call = derive_seed(seed, "reward-model-pairs", next(calls))
        return sample_completions(policy, policy_tokenizer, texts, 1.0, demo.max_completion_length, seed_of_call)

    questions = list(question_dataset("train", demo.num_train)["question"])
    answers = generate([DEMO_PROMPTS.policy.format(question=q) for q in questions])
    rubrics = generate([DEMO_PROMPTS.rubric_generation.format(question=q) for q in questions])
    pairs, _ = PairMixture(NO_TEMPORAL).build(
        questions, answers, rubrics, generate, ReplayBuffer(), 0, seed, DEMO_PROMPTS
    )
    tokenizer = AutoTokenizer.from_pretrained(JUDGE_MODEL)
    model = AutoModelForSequenceClassification.from_pretrained(JUDGE_MODEL, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(settings.rm_steps):
        batch = [pairs[i] for i in torch.randint(len(pairs), (32,), generator=generator).tolist()]
        chosen = _rm_scores(model, tokenizer, [rm_text(p.question, p.chosen) for p in batch])
        rejected = _rm_scores(model, tokenizer, [rm_text(p.question, p.rejected) for p in batch])
        loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "pairs.json").write_text(json.dumps({"pairs": len(pairs), "final_loss": loss.item()}))
    return folder


def _rm_scores(model, tokenizer, texts: list[str]) -> torch.Tensor:
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    return model(**batch).logits[:, 0]


def reward_model_reward(folder: Path):
    """The reward model's score of each completion (TRL's reward-function contract)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)

    @torch.no_grad()
    def reward_model_reward(prompts, completions, question, **kwargs) -> list[float]:
        texts = [rm_text(q, c) for q, c in zip(question, completions, strict=True)]
        return _rm_scores(model, tokenizer, texts).tolist()

    return reward_model_reward


# ----------------------------------------------------------------------------------------------------------------
# Measurement


def measure(settings: RubricLabSettings, final: Path, judge, reward_model: Path | None) -> dict[str, float]:
    """The demo's held-out measurements, the rubric separation and, for `scalar-rm`, the reward model's mean reward
    of the greedy held-out answers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_es.demo.evolm import toy
    from trl_es.demo.evolm.run import held_out_measurements, sample_completions
    from trl_es.evolm.rubrics import RubricError, parse_rubric
    from trl_es.tasks.arithmetic import problem

    model, tokenizer = AutoModelForCausalLM.from_pretrained(final).eval(), AutoTokenizer.from_pretrained(final)
    demo = settings.demo
    measurements = held_out_measurements(model, tokenizer, demo)
    problems = [p for p in (problem("test", i) for i in range(demo.num_held_out)) if p.answer != p.misread_answer]
    rubric_prompts = [toy.DEMO_PROMPTS.rubric_generation.format(question=p.question) for p in problems]
    rubrics = sample_completions(model, tokenizer, rubric_prompts, 0.0, demo.max_completion_length, 0)
    items = []
    for p, rubric in zip(problems, rubrics, strict=True):
        try:  # the judge reads a rubric as the policy reward passes it: re-serialised
            rubric_json = parse_rubric(rubric, toy.DEMO_RULES).to_json()
        except RubricError:
            continue  # an invalid rubric separates nothing
        items += [("", rubric_json, f" {p.answer}"), ("", rubric_json, f" {p.misread_answer}")]
    scores = judge.score_batch(items)
    separated = sum(1 for a, b in zip(scores[::2], scores[1::2], strict=True) if None not in (a, b) and a > b)
    measurements["rubric_separation"] = separated / len(problems)
    measurements["judge_failure_rate"] = sum(score is None for score in scores) / max(len(scores), 1)
    if reward_model is not None:
        prompts = [toy.DEMO_PROMPTS.policy.format(question=p.question) for p in problems]
        answers = sample_completions(model, tokenizer, prompts, 0.0, 8, 0)
        rewards = reward_model_reward(reward_model)(prompts, answers, [p.question for p in problems])
        measurements["rm_reward"] = statistics.fmean(rewards)
    return measurements


def run_job(settings: RubricLabSettings, model: str, method: str, seed: int, work_dir: Path, judge, log) -> dict:
    """Train and measure one (model, method, seed), or read its cached result."""
    folder = work_dir / model / f"{method}-seed{seed}"
    cached = folder / "result.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    started = time.time()
    folder.mkdir(parents=True, exist_ok=True)
    final = train_method(settings, model, method, seed, folder, judge)
    reward_model = folder / "reward_model" if method == "scalar-rm" else None
    result = {"held_out": measure(settings, final, judge, reward_model), "runtime_s": time.time() - started}
    cached.write_text(json.dumps(result))
    log(f"[rubric-lab] {model} {method} seed {seed}: {result['runtime_s']:.0f} s")
    return result


def summarize(runs: dict) -> dict:
    """`summary[model][method][metric]`: mean, std and the values over seeds."""
    summary = {}
    for model, by_method in runs.items():
        summary[model] = {}
        for method, by_seed in by_method.items():
            metrics = list(next(iter(by_seed.values()))["held_out"])
            summary[model][method] = {m: spread([r["held_out"][m] for r in by_seed.values()]) for m in metrics}
    return summary


# ----------------------------------------------------------------------------------------------------------------
# Report


def render_markdown(results: dict, plot: Path, markdown_path: Path) -> str:
    settings, summary = results["settings"], results["summary"]
    demo = settings["demo"]
    job_seconds = [job["runtime_s"] for by_method in results["runs"].values() for by_seed in by_method.values()
                   for job in by_seed.values()]  # fmt: skip
    lines = [
        "# Rubric lab: EVOLM on a toy where correctness can only come from the rubrics",
        "",
        f"Generated by `{results['command']}` on {results['machine']['nproc']} CPU cores "
        f"({results['machine']['processor']}, torch {results['machine']['torch']}); its {len(job_seconds)} jobs "
        f"took {sum(job_seconds) / 60:.0f} min of one core each in all (a job cached by an earlier run counts the "
        f"time it took then; this run: {results['runtime_s'] / 60:.0f} min). Seeds: {settings['seeds']}. "
        "Mean ± std over seeds.",
        "",
        f"Phases: {demo['rounds']} rounds of {demo['policy_steps']} policy and {demo['rubric_steps']} rubric steps; "
        f"ES N={demo['population_size']} x {demo['prompts_per_step']} questions per policy step, "
        f"N={demo['rubric_population_size']} x {demo['rubric_prompts_per_step']} per rubric step, σ={demo['sigma']}, "
        f"α={demo['learning_rate']}; GRPO the same completions per step, {demo['num_generations']} samples per "
        f"question, lr={demo['grpo_learning_rate']}; "
        f"{demo['num_train']} training questions; {demo['num_held_out']} held-out problems. Methods without rubric "
        "phases take the steps that spend the same budget of completions plus judge calls (module docstring).",
        "",
        "Models: `joint` misreads in "
        f"{RUBRIC_MISREAD['joint']:.0%} of its rubrics and 50% of its answers (the stated asymmetry); `null` in "
        f"{RUBRIC_MISREAD['null']:.0%} of both (the control). The judge reads rubric and response, never the "
        "question.",
        "",
        f"![headline metrics]({plot.relative_to(markdown_path.parent)})",
        "",
    ]
    for model, by_method in summary.items():
        lines += [f"## {model}", "", "| method | " + " | ".join(HEADLINE) + " | rubric valid | judge fail |"]
        lines.append("|" + " --- |" * (len(HEADLINE) + 3))
        for method, metrics in by_method.items():
            cells = [_cell(metrics[name]) for name in HEADLINE]
            valid = spread([1 - v for v in metrics["rubric_invalid_greedy"]["values"]])
            cells += [_cell(valid), _cell(metrics["judge_failure_rate"])]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        if "scalar-rm" in by_method:
            rm = by_method["scalar-rm"]
            lines += [
                "",
                f"scalar-rm: reward model's mean reward on held-out greedy answers {_cell(rm['rm_reward'])}, "
                f"true accuracy {_cell(rm['greedy_accuracy'])}.",
            ]
        lines.append("")
    lines += [
        "## What the toy can and cannot test",
        "",
        "It can test: co-evolution against static rubrics and against the sequential schedule; the pair builders; "
        "ES against GRPO for each role; a scalar reward model trained on the same self-generated pairs; indicator "
        "against margin rubric rewards; and, through the null control, whether an effect needs the stated asymmetry.",
        "",
        "It cannot test: the paper's 12-benchmark averages, rubrics written by a frontier model (GPT-4.1), holistic "
        "judging of long answers, or judge quality as a function of the judge's training time (one judge is shipped).",
        "",
        "Metrics: `right_reading` = c/(c+m) over greedy answers that are correct (c) or misread (m); `slip_rate`: "
        "neither; `rubric_correct_sampled`: rubrics sampled at temperature 1 (as the policy phases draw them) that "
        "state the right answer; `rubric_separation`: held-out problems whose greedy rubric makes the judge score the "
        "right answer above the misread one.",
    ]
    return "\n".join(lines) + "\n"


def _cell(stat: dict) -> str:
    return f"{stat['mean']:.3f} ± {stat['std']:.3f}"


def plot_headline(summary: dict, path: Path) -> Path:
    from trl_es.evaluation.plots import pyplot, save_figure

    plt = pyplot()
    figure, axes_row = plt.subplots(1, len(summary), figsize=(7 * len(summary), 5), squeeze=False)
    for axes, (model, by_method) in zip(axes_row[0], summary.items(), strict=True):
        methods = list(by_method)
        for offset, name in enumerate(("greedy_accuracy", "right_reading", "rubric_correct_sampled")):
            means = [by_method[m][name]["mean"] for m in methods]
            stds = [by_method[m][name]["std"] for m in methods]
            positions = [i + (offset - 1) * 0.27 for i in range(len(methods))]
            axes.bar(positions, means, width=0.27, yerr=stds, capsize=2, label=name)
        axes.set_xticks(range(len(methods)), methods, rotation=60, ha="right")
        axes.set_ylim(0, 1)
        axes.set_title(f"{model}: held-out, mean ± std over seeds")
        axes.grid(alpha=0.3, axis="y")
        axes.legend()
    return save_figure(figure, path)


def run_lab(settings: RubricLabSettings, output_dir: Path, markdown: Path, work_dir: Path, command: str, log=print):
    from trl_es.demo.evolm.run import demo_judge

    started = time.time()
    machine = machine_info()
    torch.set_num_threads(1)
    judge = demo_judge()
    runs = {
        model: {
            method: {seed: run_job(settings, model, method, seed, work_dir, judge, log) for seed in settings.seeds}
            for method in settings.methods
        }
        for model in settings.models
    }
    results = {
        "command": command,
        "machine": machine,
        "settings": asdict(settings),
        "summary": summarize(runs),
        "runs": runs,
        "runtime_s": time.time() - started,
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    plot = plot_headline(results["summary"], output_dir / "headline.png")
    markdown.write_text(render_markdown(results, plot, markdown))
    log(f"[rubric-lab] wrote {output_dir / 'results.json'}, {plot} and {markdown}")
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m experiments.rubric_lab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="Number of seeds (0, 1, ...; default %(default)s).")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--models", nargs="+", choices=["joint", "null"], default=["joint", "null"])
    parser.add_argument("--quick", action="store_true", help="A smoke test: short phases, one seed.")
    parser.add_argument("--output_dir", default="docs/rubric_lab", help="results.json and the plot.")
    parser.add_argument("--markdown", default=None, help="The report (default: <output_dir>.md).")
    parser.add_argument("--work_dir", default=None, help="Checkpoints and cached results (default: <tmp>).")
    args = parser.parse_args(argv)
    settings = quick_settings() if args.quick else RubricLabSettings(seeds=tuple(range(args.seeds)))
    settings = replace(settings, methods=tuple(args.methods), models=tuple(args.models))
    if not args.quick:
        settings = replace(settings, seeds=tuple(range(args.seeds)))
    output_dir = Path(args.output_dir)
    markdown = Path(args.markdown) if args.markdown else output_dir.with_suffix(".md")
    suffix = "-quick" if args.quick else ""
    work_dir = Path(args.work_dir or Path(tempfile.gettempdir()) / f"trl-es-rubric-lab{suffix}")
    command = "python -m experiments.rubric_lab " + " ".join(
        shlex.quote(arg) for arg in (argv if argv is not None else sys.argv[1:])
    )
    return run_lab(settings, output_dir, markdown, work_dir, command.strip())


if __name__ == "__main__":
    main()
