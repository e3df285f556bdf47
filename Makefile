# The two commands of the README: `make demo` (run ragmon and show it working) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo serve test lint install

$(BIN)/ragmon: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(BIN)/ragmon

install: $(BIN)/ragmon

demo: install
	$(BIN)/ragmon demo

serve: install
	$(BIN)/ragmon serve

test: install
	scripts/test.sh

lint: install
	$(BIN)/ruff check service sampler detectors dashboards tests bench scripts
	$(BIN)/ruff format --check service sampler detectors dashboards tests bench scripts
