"""The ES ablation: each estimator knob of `ESConfig` changed alone from the demo's settings, on the embedded task, at
an equal completion budget, over several seeds, every cell with a bootstrap interval.

`make ablation` (`python -m experiments.es_ablation` from the repository root) trains ES from the model in
`trl_es/demo/model` on the offline arithmetic task once per (variant, seed). A variant changes one knob: the population
size N (8, 16, 32, 64), sigma, the fitness shaping (z-score, centred ranks, none, per-prompt), the one- or two-point
estimator, the optimizer on the ES direction (SGD, momentum, Adam), a sigma schedule or the adaptive sigma, and the
Pass@k fitness. Every variant spends the same number of completions (`AblationSettings.budget`), so a larger N takes
fewer steps.

Each run is measured twice, for two purposes kept apart: the centre's greedy accuracy on training problems
(`num_train_eval`, the first of the training split) is what a setting is *chosen* on; greedy accuracy and Pass@k on
held-out test problems are what is *reported*, never used to choose. Intervals are the two-level bootstrap over seeds
and problems of `trl_es.evaluation.intervals`, paired against the default's runs of the same seeds.

Modules: `settings` (the variants and the budget), `jobs` (one run: train, measure), `report` (the tables, the
readings and the plot, `docs/ablation.md`, from the results file alone), `cli` (the command line and the run).
"""
