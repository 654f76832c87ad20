"""`python -m experiments.rubric_lab`: see `experiments.rubric_lab.cli`."""

from experiments.rubric_lab.cli import main

main()
