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

# Unit tests and notebooks run in two processes: a notebook client sharing a process with the
# unit tests (their threads, tensor subclasses, ...) was seen to hang waiting for kernel messages.
test: $(VENV)/.installed
	$(BIN)/ruff check attn_gym_lite tests scripts
	$(BIN)/python -m pytest -q tests
	$(BIN)/python -m pytest -q --nbmake notebooks
