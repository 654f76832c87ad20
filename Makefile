# Every target creates (or reuses) the virtual environment .venv with everything it needs.
# torch is installed first and pinned: on this project's CPU machines `torch==2.13.0` is the CPU wheel on disk,
# while a bare `torch` would pull a multi-GB CUDA build. Override TORCH_SPEC on GPU machines if you need another build.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.trl-es-installed

.PHONY: install demo test test-fast lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/trl-es demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) build dist *.egg-info
