# streamfuzz. Every target bootstraps .venv on first use:
#  - where $(PYTHON) already has torch (a GPU node), the venv sees every package
#    $(PYTHON) sees, offline, through a .pth file that adds its site directories
#    (a --system-site-packages venv made from a python3 that is itself a venv
#    would see only the base interpreter's), and uses its pip; a test tool it
#    lacks is installed;
#  - otherwise it installs torch==2.13.0 (the CPU wheel) and the test tools.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUDGET ?= 60
EXAMPLES ?= 300
SOAK_OUT ?= soak
TARGETS ?=
# Worlds side by side (default: as many as the node holds; docs/soak.md).
WORLDS ?=
# Test workers: one per core, at most 8 (each test may start two or three rank processes).
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 8 ] && n=8; echo $$n)
# Modules the runs and tests import, as "module=distribution".
TOOLS := hypothesis=hypothesis pytest=pytest xdist=pytest-xdist numpy=numpy matplotlib=matplotlib

.PHONY: fuzz soak test test-fast replay lint typecheck wheel-check bench bench-checked bench-peers \
	matrix clean vllm vllm-fetch

$(VENV)/.ready: pyproject.toml
	@if $(PYTHON) -c 'import torch' >/dev/null 2>&1; then \
		echo "bootstrap: $(VENV) reuses the torch and packages of $(PYTHON) (no download)"; \
		$(PYTHON) -m venv --without-pip $(VENV) && \
		$(PYTHON) -c 'import site; [print("import site; site.addsitedir(%r)" % d) for d in site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]' \
			> "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_streamfuzz_parent.pth" && \
		{ $(PY) -c 'import pip' 2>/dev/null || { echo "bootstrap: $(PYTHON) has no pip"; exit 1; }; } && \
		missing=$$(for t in $(TOOLS); do $(PY) -c "import $${t%%=*}" 2>/dev/null || echo $${t#*=}; done) && \
		if [ -n "$$missing" ]; then \
			echo "bootstrap: installing what $(PYTHON) lacks:" $$missing; \
			$(PY) -m pip install -q $$missing || exit 1; \
		fi && \
		echo "bootstrap: installing streamfuzz itself (editable, offline)" && \
		$(PY) -m pip install -q --no-index --no-deps --no-build-isolation -e . ; \
	else \
		echo "bootstrap: $(PYTHON) has no torch: installing torch==2.13.0 (CPU wheel) and the"; \
		echo "bootstrap: test tools into $(VENV); this takes a minute or two, once"; \
		$(PYTHON) -m venv $(VENV) && \
		$(PY) -m pip install -q torch==2.13.0 && \
		$(PY) -m pip install -q -e '.[dev]'; \
	fi
	@touch $@

# Every protocol's versions on --device auto, each until EXAMPLES examples or BUDGET
# seconds (then shrinking), then a table. Exit status 1 (failures found and
# saved) is this command's purpose, not an error; anything else (2 bad usage,
# 70 streamfuzz crashed, 130 interrupted) fails the target.
fuzz: $(VENV)/.ready
	@$(PY) -m streamfuzz run --device auto --budget $(BUDGET) --max-examples $(EXAMPLES) \
		--report reports/fuzz.json $(if $(WORLDS),--worlds $(WORLDS)); rc=$$?; test $$rc -le 1

# vLLM's own PPHandler (docs/vllm.md): VLLM's wheel is fetched
# without dependencies into the cache if absent, then vllm-pp (and, for
# 0.30-0.32, the derived vllm-pp-pre-pr) is fuzzed on DEVICE: cpu, cuda or auto.
VLLM ?= 0.34.0
DEVICE ?= auto
vllm: vllm-fetch
	@$(PY) -m streamfuzz run --upstream $(VLLM) --device $(DEVICE) --budget $(BUDGET) \
		--max-examples $(EXAMPLES) --report reports/vllm-$(VLLM).json; rc=$$?; test $$rc -le 1

vllm-fetch: $(VENV)/.ready
	@$(PY) -m streamfuzz.vllm fetch $(VLLM)

# A time-budgeted campaign (docs/soak.md): BUDGET is 30s, 10m, 8h...; the same
# SOAK_OUT resumes it. Report, plot and log land in SOAK_OUT, failures in corpus/.
soak: $(VENV)/.ready
	@$(PY) -m streamfuzz soak --device auto --budget $(BUDGET) --out $(SOAK_OUT) \
		$(if $(TARGETS),--target $(TARGETS)) $(if $(WORLDS),--worlds $(WORLDS)); \
		rc=$$?; test $$rc -le 1

test: $(VENV)/.ready
	$(PY) -m pytest -n $(JOBS) -q

# The fast tier: unit tests that start no process (FAST_MODULES in tests/conftest.py).
test-fast: $(VENV)/.ready
	$(PY) -m pytest -n $(JOBS) -q -m "fast and not slow"

# The wheel, built and installed into a fresh virtualenv that sees torch and the test
# tools but not this checkout: it installs only the streamfuzz import name, and
# `python -m streamfuzz run`, its ranks and the pytest plugin work from it (tests/test_wheel.py).
wheel-check: $(VENV)/.ready
	$(PY) -m pytest -q -p no:cacheprovider -m slow tests/test_wheel.py

replay: $(VENV)/.ready
	$(PY) -m streamfuzz replay corpus

# The CPU column of the target x oracle matrix: fails if the lifetime oracle
# misses a buggy target or a mutant on any seed, or flags the correct target.
SEEDS ?= 3
matrix: $(VENV)/.ready
	$(PY) -m streamfuzz matrix --device cpu --oracle lifetime --seeds $(SEEDS) --max-examples 200

lint: $(VENV)/.ready
	$(PY) -m ruff check fuzz strategies streamfuzz tests bench examples

# mypy over fuzz, strategies and streamfuzz, as pyproject.toml's [tool.mypy] sets it:
# strict on the contract modules, the rest checked, modules still owing fixes named there.
# It reads them as the wheel lays them out, through links in $(TYPECHECK_TREE) (made
# afresh each time, its cache kept); its messages name the repository's files.
# A venv that reused another interpreter's packages gets mypy here, once.
TYPECHECK_TREE := build/typecheck
typecheck: $(VENV)/.ready
	@$(PY) -c 'import mypy' 2>/dev/null || { echo "bootstrap: installing mypy"; $(PY) -m pip install -q mypy; }
	@rm -rf $(TYPECHECK_TREE)/streamfuzz && mkdir -p $(TYPECHECK_TREE)/streamfuzz && \
		for f in streamfuzz/*.py; do ln -s "$(CURDIR)/$$f" $(TYPECHECK_TREE)/streamfuzz/; done && \
		ln -s "$(CURDIR)/fuzz" "$(CURDIR)/strategies" $(TYPECHECK_TREE)/streamfuzz/
	@cd $(TYPECHECK_TREE) && out=$$("$(abspath $(PY))" -m mypy --config-file "$(CURDIR)/pyproject.toml" \
		streamfuzz 2>&1); rc=$$?; printf '%s\n' "$$out" | \
		sed -e 's#^streamfuzz/fuzz/#fuzz/#' -e 's#^streamfuzz/strategies/#strategies/#'; exit $$rc

# Throughput against a hand-written loop, time to first failure, gates vs spins,
# on every available device; JSON and a markdown table under BENCH_OUT.
BENCH_OUT ?= reports/bench
bench: $(VENV)/.ready
	$(PY) -m streamfuzz bench --device auto --out $(BENCH_OUT)

# What a streamfuzz.checked() block adds to a user's Hypothesis test (bench/README.md).
bench-checked: $(VENV)/.ready
	PYTHONPATH=. $(PY) bench/checked_overhead.py --device auto --out $(BENCH_OUT)/checked.json

# streamfuzz beside CSAN, compute-sanitizer and a stress test, on one GPU, inside
# PEERS_BUDGET seconds (bench/README.md, "Peers"); on a machine without a GPU, one line.
PEERS_BUDGET ?= 420
bench-peers: $(VENV)/.ready
	PYTHONPATH=. $(PY) bench/peers.py --budget $(PEERS_BUDGET) --out $(BENCH_OUT)/peers

clean:
	rm -rf $(VENV) reports soak build .hypothesis .pytest_cache
