"""`python -m experiments.coverage_lab`: see `experiments.coverage_lab.cli`."""

from experiments.coverage_lab.cli import main

main()
