# One venv, made by this file. `make demo` runs the main job; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv demo test lint clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: the CPU build (a bare `torch` would pull a multi-GB CUDA build)
	$(PY) -m pip install -q torch==2.13.0
	# lmeval: the lm-eval adapter's tests run against the real harness (they fail, not skip, under `make test`)
	$(PY) -m pip install -q -e '.[test,plot,triton,bench,lmeval,serve]'
	touch $@

demo: venv
	$(PY) -m specfold.cli demo

test: venv
	SPECFOLD_REQUIRE_LM_EVAL=1 $(PY) -m pytest

lint: venv
	$(PY) -m ruff check src tests

clean:
	rm -rf $(VENV) build
