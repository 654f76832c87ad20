"""The rubric lab: EVOLM's variants and baselines at equal budgets, on the demo's joint model and its null control.

`make rubric-lab` (`python -m experiments.rubric_lab` from the repository root) measures the gates of the joint and
null arms of every pretraining seed (`arms`: seed 0 is the pair the demo ships, the others are pretrained first),
refuses to go on if one fails, then trains every method from each arm for every training seed and measures, on
held-out problems, with the verifier (which only the `verifier` method also trains on): greedy accuracy, Pass@k, the
right-reading rate c/(c+m), the slip rate, the rubrics' correctness, genericity and validity, how often the greedy
rubric makes the judge separate the right answer from the misread one, and the judge's failure rate; every EVOLM
phase's diagnostics read the same verifier, for evaluation only. Accuracies and the differences the goal reads carry
bootstrap intervals over pretraining seeds and problems (`stats`). It writes `results.json`, two plots and a Markdown
report (`docs/rubric_lab.md`); `python -m experiments.rubric_lab --report` redraws the plots and the report from
`docs/rubric_lab/results.json` alone.

Methods (`METHODS`):
- `base`: the pretrained model;
- `verifier`: ES on the verifier's reward, the upper bound (the only method that sees answers);
- `static`: policy phases only, on the starting model's rubrics (sampled at the rubric temperature); `static-greedy`:
  on its greedy rubrics;
- `coevolve-<pairs>`: EVOLM, policy and rubric phases alternating, with temporal, rubric-conditioned, inferred-question
  or mixed pairs and the demo's margin rubric reward; `coevolve-indicator`: temporal pairs with the indicator reward;
  `coevolve-anchored`: temporal pairs with every ES phase held near its start by the KL anchor on both roles' prompts
  (`kl_anchor_beta=1`, set before any run); `coevolve-live`: temporal pairs, policy phases reading rubrics written at
  every step;
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

Modules: `settings` (the methods, what a run depends on, the budgets), `arms` (the models of each pretraining seed,
and their gates), `training` and `reward_model` (what a job trains), `measuring` (what a job measures, its phases'
diagnostics, and the mean ± std over runs), `stats` (the paired bootstrap), `jobs`, `report` (`docs/rubric_lab.md`
and its plots from the results file), `cli` (the command line and the run). `experiments.harness` holds what this lab
shares with the coverage lab.
"""
