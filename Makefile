# The two commands of the README: `make demo` (run ragmon and show it working) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# One stamp per install, each redone when pyproject.toml changes: `make demo` on a fresh clone
# installs the runtime only, and `make test` after it still adds the test extras.
RUNTIME_STAMP := $(VENV)/.runtime-installed
TEST_STAMP := $(VENV)/.test-installed

.PHONY: demo serve test lint install install-test

$(BIN)/python:
	@echo "==> creating the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	@echo "==> installing ragmon and its runtime dependencies into $(VENV)"
	$(BIN)/pip install -e .
	touch $@

# `.[test]` holds the runtime too, so the runtime stamp is brought up to date with it
$(TEST_STAMP): pyproject.toml | $(BIN)/python
	@echo "==> installing ragmon with the test extras into $(VENV)"
	$(BIN)/pip install -e '.[test]'
	touch $@ $(RUNTIME_STAMP)

install: $(RUNTIME_STAMP)

install-test: $(TEST_STAMP)

demo: install
	$(BIN)/ragmon demo

serve: install
	$(BIN)/ragmon serve

test: install-test
	scripts/test.sh

lint: install-test
	$(BIN)/ruff check service sampler detectors dashboards tests bench scripts
	$(BIN)/ruff format --check service sampler detectors dashboards tests bench scripts
