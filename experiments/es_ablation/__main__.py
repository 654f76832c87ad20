"""`python -m experiments.es_ablation`: see `experiments.es_ablation.cli`."""

from experiments.es_ablation.cli import main

main()
