# Two commands on a fresh machine: `make demo` (the main job) and `make test`.
# Both create .venv when missing. torch is pinned to the CPU wheel this machine class has on disk.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[test,scip,hf]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/uniap demo

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/published_runs.py
	$(BIN)/python benchmarks/nccl_busbw.py
	$(BIN)/python benchmarks/search_scaling.py
	$(BIN)/python benchmarks/paper_table.py

clean:
	rm -rf $(VENV) .pytest_cache
