# Two commands a newcomer needs: `make demo` and `make test`. Both set up .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast bench clean

$(STAMP): pyproject.toml setup.py $(wildcard open1b_data/build/_bpe*.[ch])
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# A CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/open1b-data build-mix
	$(BIN)/open1b-data stream-at build/demo-mix --step 1 --rank 0 --world 2 --decode

test: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -m "not gpu" --timeout=900

# Installs the benchmark-only peers (datatrove); each benchmark's command is in BENCHMARKS.md.
bench: $(STAMP)
	$(BIN)/pip install -q -e '.[test,bench]'

clean:
	rm -rf build .pytest_cache
