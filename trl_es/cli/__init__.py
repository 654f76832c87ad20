"""The `trl-es` command (`main.py`) and the training scripts it runs through `accelerate launch`, in the shape of
TRL's `trl/scripts/`. Each script exposes `make_parser(prog=...)` and `main(...)`, and runs on its own too:
`accelerate launch trl_es/cli/es.py --help`.
"""
