# The two commands of the README, each doing all of its own set-up on a fresh
# machine: a virtualenv in .venv, cdcflow and its test extras, Java for Spark.
#
#   make run    run connectors.yaml on the embedded default
#   make test   lint, type-check and run the test suite
#
# Other targets: setup, lint, typecheck, unit, integration, bench, clean.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TYPECHECK_ROOT := build/typecheck
PYTEST_ARGS ?=
# make run RUN_ARGS=          runs until Ctrl-C; the default stops after two minutes with a summary.
RUN_ARGS ?= --duration 120

.PHONY: run test setup java mariadb chromium lint typecheck unit integration bench clean

$(STAMP): pyproject.toml setup.py plugins/sources/tikv/tidb/_rowfast.c plugins/codecs/_opfast.c
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

setup: $(STAMP) java mariadb chromium

# Spark needs Java 17 or newer; install Debian's headless JRE when it is missing.
java:
	@bash scripts/ensure-java.sh

# The MySQL sink's integration tests start a private MariaDB; install Debian's when missing.
mariadb:
	@bash scripts/ensure-mariadb.sh

# The status page's browser test drives headless Chromium; install Debian's with its driver when missing.
chromium:
	@bash scripts/ensure-chromium.sh

run: setup
	$(BIN)/cdcflow validate connectors.yaml
	$(BIN)/cdcflow plugins
	$(BIN)/cdcflow run connectors.yaml $(RUN_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check core plugins tests benchmarks examples
	$(BIN)/ruff format --check core plugins tests benchmarks examples

# mypy sees core/ and plugins/ under their import names through a symlink tree.
typecheck: $(STAMP)
	@mkdir -p $(TYPECHECK_ROOT)/cdcflow
	@ln -sfn ../../../core $(TYPECHECK_ROOT)/cdcflow/core
	@ln -sfn ../../../plugins $(TYPECHECK_ROOT)/cdcflow/plugins
	cd $(TYPECHECK_ROOT) && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p cdcflow.core -p cdcflow.plugins

test: setup lint typecheck
	$(BIN)/python -m pytest $(PYTEST_ARGS)

unit: setup
	$(BIN)/python -m pytest -m "not integration" $(PYTEST_ARGS)

integration: setup
	$(BIN)/python -m pytest -m integration $(PYTEST_ARGS)

# Each benchmark prints rates next to a baseline measured in the same run.
bench: setup
	@for f in benchmarks/bench_*.py; do $(BIN)/python -m benchmarks.$$(basename $$f .py) || exit 1; done

clean:
	rm -rf $(VENV) build .mypy_cache .pytest_cache .ruff_cache data
	find core plugins -name '*.so' -delete  # the C row decoder, built in place by the install
