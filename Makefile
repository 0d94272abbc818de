# One venv, made by this file in two stages: `core` (torch and the package's runtime dependencies: what `make demo`,
# the main job, needs) and `venv` (core plus every extra: tests, plots, Triton, lm-eval, the server). `make test` runs
# the tests (one pytest-xdist worker per core, a test file per worker so module fixtures are built once; a single
# `pytest tests/x.py` runs in one process).
# pyproject.toml states the supported version ranges; constraints.txt pins what CI installs (reproducible venvs).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_CPU := torch==2.13.0

.PHONY: core venv demo test lint clean constraints

core: $(VENV)/.core
venv: $(VENV)/.installed

# NOTE: `make demo` on a fresh clone pays for this stage only (about a minute on the project's CPUs; the extras
# below take two more): see docs/results.md, "make demo end to end".
$(VENV)/.core: pyproject.toml Makefile constraints.txt
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: the CPU build (a bare `torch` would pull a multi-GB CUDA build)
	$(PY) -m pip install -q -c constraints.txt $(TORCH_CPU)
	$(PY) -m pip install -q -c constraints.txt -e .
	touch $@

$(VENV)/.installed: $(VENV)/.core
	# lmeval: the lm-eval adapter's tests run against the real harness (they fail, not skip, under `make test`)
	$(PY) -m pip install -q -c constraints.txt -e '.[test,plot,triton,bench,lmeval,serve]'
	touch $@

# Re-pin CI to what the venv holds now (after an upgrade that passed `make test`).
constraints: venv
	{ sed -n '/^#/p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^specfold' \
		| sed 's/+cpu$$//'; } > constraints.txt.new && mv constraints.txt.new constraints.txt

demo: core
	$(PY) -m specfold.cli demo

test: venv
	SPECFOLD_REQUIRE_LM_EVAL=1 $(PY) -m pytest -n auto --dist loadfile

lint: venv
	$(PY) -m ruff check src tests

clean:
	rm -rf $(VENV) build
