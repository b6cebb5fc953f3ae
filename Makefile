# streamfuzz. Every target bootstraps .venv on first use:
#  - where a python3 already has torch (a GPU node), the venv reuses it;
#  - otherwise it installs torch==2.13.0 (the CPU wheel) and the test tools.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUDGET ?= 60
EXAMPLES ?= 300
SOAK_OUT ?= soak
TARGETS ?=

.PHONY: fuzz soak test replay lint bench matrix clean

$(VENV)/.ready: pyproject.toml
	@if $(PYTHON) -c 'import torch' >/dev/null 2>&1; then \
		echo "bootstrap: reusing the torch of $(PYTHON)"; \
		$(PYTHON) -m venv --system-site-packages $(VENV) && \
		$(PY) -m pip install -q --no-deps --no-build-isolation -e . ; \
	else \
		echo "bootstrap: installing torch==2.13.0 (CPU) and the test tools"; \
		$(PYTHON) -m venv $(VENV) && \
		$(PY) -m pip install -q torch==2.13.0 && \
		$(PY) -m pip install -q -e '.[dev]'; \
	fi
	@touch $@

# Every built-in target on --device auto, a bounded time each, then a table.
# Exit status 1 (failures found and saved) is this command's purpose, not an error.
fuzz: $(VENV)/.ready
	@$(PY) -m fuzz run --device auto --budget $(BUDGET) --max-examples $(EXAMPLES) \
		--report reports/fuzz.json; rc=$$?; test $$rc -le 1

# A time-budgeted campaign (docs/soak.md): BUDGET is 30s, 10m, 8h...; the same
# SOAK_OUT resumes it. Report, plot and log land in SOAK_OUT, failures in corpus/.
soak: $(VENV)/.ready
	@$(PY) -m fuzz soak --device auto --budget $(BUDGET) --out $(SOAK_OUT) \
		$(if $(TARGETS),--targets $(TARGETS)); rc=$$?; test $$rc -le 1

test: $(VENV)/.ready
	$(PY) -m pytest -n 2 -q

replay: $(VENV)/.ready
	$(PY) -m fuzz replay corpus

# The CPU column of the target x oracle matrix: fails if the lifetime oracle
# misses a buggy target or a mutant on any seed, or flags the correct target.
SEEDS ?= 3
matrix: $(VENV)/.ready
	$(PY) -m fuzz matrix --device cpu --oracle lifetime --seeds $(SEEDS) --max-examples 200

lint: $(VENV)/.ready
	$(PY) -m ruff check fuzz strategies streamfuzz tests bench examples

# Throughput against a hand-written loop, time to first failure, gates vs spins,
# on every available device; JSON and a markdown table under BENCH_OUT.
BENCH_OUT ?= reports/bench
bench: $(VENV)/.ready
	$(PY) -m fuzz bench --device auto --out $(BENCH_OUT)

clean:
	rm -rf $(VENV) reports soak .hypothesis .pytest_cache
