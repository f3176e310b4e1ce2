# Every target sets itself up on a fresh machine: system packages (Java, Maven,
# kcat), a virtual environment with redrive and its dependencies, the broker jars.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.redrive-installed
SYSTEM_STAMP := $(VENV)/.redrive-system
PYTEST_ARGS ?=
# Test processes side by side (pytest-xdist): most of a test's time is spent waiting
# on brokers, databases and Spark, so more than the cores. See docs/testing.md.
TEST_WORKERS ?= 4

.PHONY: setup demo test bench chaos lint format clean

$(SYSTEM_STAMP): scripts/install-system-deps.sh
	@scripts/install-system-deps.sh
	@mkdir -p $(VENV) && touch $@

$(STAMP): pyproject.toml $(SYSTEM_STAMP)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "redrive needs Python 3.11+ (set PYTHON=...)")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "redrive set-up: installing Python dependencies into $(VENV)"
	@$(BIN)/python -m pip install -q --disable-pip-version-check -U pip
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[service,spark,dev]'
	@touch $@

setup: $(STAMP)
	@$(BIN)/redrive local fetch >/dev/null

demo: setup
	@$(BIN)/redrive demo $(if $(filter 1 yes true,$(DEMO_ONESHOT)),--oneshot)

test: setup lint
	@$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

chaos: setup
	@REDRIVE_CHAOS=long $(BIN)/python -m pytest tests/chaos -m chaos -s $(PYTEST_ARGS)

lint: $(STAMP)
	@$(BIN)/ruff check src tests bench
	@$(BIN)/ruff format --check src tests bench
	@$(BIN)/mypy

format: $(STAMP)
	@$(BIN)/ruff format src tests bench
	@$(BIN)/ruff check --fix src tests bench

bench: setup
	@$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info
