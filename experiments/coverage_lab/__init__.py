"""The coverage lab: base, ES, GRPO, ES→GRPO and GRPO→ES on the embedded arithmetic model, at equal completion budgets.

`make lab` (`python -m experiments.coverage_lab` from the repository root) trains every method from the model in
`trl_es/demo/model` on the offline task (`trl_es.tasks.arithmetic`) for several seeds and measures, on held-out
problems: greedy accuracy, Pass@k and Maj@k from 16 samples at temperature 1, token entropy
(`trl_es.evaluation.coverage`), the relative parameter shift from the base
(`trl_es.evaluation.analysis.parameter_shift`), the JS diversity of the ES population at the start and end of ES
(`trl_es.evaluation.metrics.js_diversity`), and Pass@1 of sparsified ES checkpoints
(`trl_es.evaluation.analysis.sparsify`). It writes `results.json`, PNG plots and a Markdown report;
`python -m experiments.coverage_lab --report` redraws the plots and the report from `docs/lab/results.json` alone.

ES runs with the demo's settings (`trl_es.demo.run.DemoSettings`) and every model is measured with the demo's
`held_out_report`.

The budget is counted in completions: an ES step costs `population_size x prompts` completions (every member answers
the same prompts greedily), a GRPO step `prompts x num_generations`. Each (method, seed) is one job; jobs run in
worker processes (one torch thread each) and cache their result in `work_dir`, so an interrupted lab resumes.

Modules: `settings` (what a run depends on, the budgets), `training` and `measuring` (what a job does), `jobs`,
`summary` (mean ± std over seeds), `plots` and `report` (`docs/lab.md` from the results file), `cli` (the command
line and the run). `experiments.harness` holds what this lab shares with the rubric lab.
"""
