# Two entry points, each doing its own set-up: `make book` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -r requirements.txt
	touch $@

.PHONY: book test
book: $(VENV)/.installed
	$(BIN)/jupyter-book build . --warningiserror --keep-going

test: $(VENV)/.installed
	$(BIN)/python -m pytest -q tests notebooks --nbmake
