# Two commands a newcomer needs: `make demo` and `make test`. Both set up .venv first.
# `make demo` installs only what the demo runs: the package and its runtime dependencies
# (a 1.4 GB .venv, half of it the CPU build of torch). `make test` adds the test extra
# (pytest, moto, transformers, datasets, and triton for the kernel parity tests: 3.1 GB,
# measured 2026-12-05: README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check
RUNTIME := $(VENV)/.installed-runtime
TESTDEPS := $(VENV)/.installed
# every C source and header of the extensions (open1b_kernels: one per folder), so an edit
# to any of them rebuilds
SOURCES := pyproject.toml setup.py $(wildcard open1b_data/ingest/tokenizer/_bpe*.[ch]) $(wildcard open1b_kernels/*/_*.[ch])

.PHONY: setup demo test test-fast bench clean

# The package and its runtime dependencies, with a line before each slow step.
define install_runtime
	@echo "==> [setup 1/4] virtual environment $(VENV)"
	$(PY) -m venv $(VENV)
	@echo "==> [setup 2/4] upgrading the bundled pip of the new environment"
	$(PIP) install -q --upgrade pip
	@echo "==> [setup 3/4] torch, CPU build first (190 MB download, 750 MB installed; an"
	@echo "    unpinned torch would pull a multi-GB CUDA build)"
	$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) install --progress-bar on torch==2.13.0
	@echo "==> [setup 4/4] open1b and its runtime dependencies (numpy, pyarrow, tokenizers,"
	@echo "    tiktoken, ...); compiles the optional C extensions (~20 s)"
	$(PIP) install --progress-bar on -e .
endef

$(RUNTIME): $(SOURCES)
	$(install_runtime)
	touch $@

$(TESTDEPS): $(SOURCES)
	$(install_runtime)
	@echo "==> [setup] the test extra: pytest, ruff, moto, transformers, datasets, triton, selenium, lm-eval (1.4 GB)"
	$(PIP) install --progress-bar on -e '.[test]'
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then \
	  echo "==> [setup] headless Chromium for the explorer's browser tests: present"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "==> [setup] apt-get install chromium chromium-driver (the explorer's browser tests)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; \
	else \
	  echo "==> [setup] no chromium + chromedriver and not root with apt-get: the browser tests will skip"; \
	fi
	touch $@

setup: $(RUNTIME)

demo: $(RUNTIME)
	@echo "==> building the demo mix (manifests/demo.toml): tokenizer training, filters, shards"
	$(BIN)/open1b-data build-mix
	@echo "==> the tokens rank 0 of 2 reads at step 1, decoded"
	$(BIN)/open1b-data stream-at build/demo-mix --step 1 --rank 0 --world 2 --decode
	@echo "==> training the demo preset for 24 steps on the demo mix (every step hashed; the"
	@echo "    validation loss on the mix's held-out windows at steps 12 and 24; ~30 s on 2 cores)"
	$(BIN)/open1b-train run --preset demo --mix build/demo-mix --steps 24 --eval-every 12 --out build/demo-run
	$(BIN)/open1b-train plot build/demo-run
	@echo "==> step 24 as logged: its hashes, training loss and validation loss per source"
	$(BIN)/open1b-train show build/demo-run --step 24 --top 0
	@echo "==> check a step as an auditor would: replay step 24 from its checkpoint"
	$(BIN)/open1b-audit replay build/demo-run --step 24

test: $(TESTDEPS)
	@echo "==> ruff check . (the whole tree: E, F, W)"
	$(BIN)/ruff check .
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -n 2 -m "not gpu" --timeout=900

# Installs the benchmark-only peers (datatrove). Benchmarks run from the repository root as
# `.venv/bin/python -m benchmarks.<system>.<name>`; each one's command is in BENCHMARKS.md.
bench: $(TESTDEPS)
	$(PIP) install -q -e '.[test,bench]'

clean:
	rm -rf build .pytest_cache
