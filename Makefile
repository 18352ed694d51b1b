# cupy_flashattn developer commands.  `make` (= `make help`) lists them.
#
# demo, test, lint and check-wheel use a virtual environment in .venv (created on first use;
# `pip install -e '.[test,cuda12]'` is re-run only when setup.cfg or pyproject.toml changed,
# tracked by a stamp file inside the venv).  test-gpu and bench run in place with the python3
# already on the machine (the GPU machine has no network), with the checkout on PYTHONPATH.
#
# `make demo` installs what this machine can use: with an NVIDIA GPU (nvidia-smi on PATH or
# /dev/nvidia0 present) the same '.[test,cuda12]' as `make test`; without one only the CPU set
# (numpy, ml_dtypes, numba: `pip install -e .`, ~70 MB of wheels instead of ~540 MB).
# Override with `make demo DEMO_EXTRAS=test,cuda12` (or DEMO_EXTRAS= for the CPU set).
# `make test` always installs '.[test,cuda12]': CI (no GPU) compiles every kernel with NVRTC,
# which needs the cupy and nvidia-cuda-nvrtc/runtime wheels.

PYTHON   ?= python3
VENV     ?= .venv
EXTRAS   ?= test,cuda12
VPY      := $(VENV)/bin/python
comma    := ,
# The CPU set (no extras) is stamped "cpu"; it is part of every other set, so installing
# another set keeps its stamp, and installing it keeps the others'.
STAMP    := $(VENV)/.installed-$(or $(subst $(comma),-,$(EXTRAS)),cpu)
PIP_TARGET := $(if $(EXTRAS),'.[$(EXTRAS)]',.)
HAVE_GPU := $(shell { command -v nvidia-smi || ls /dev/nvidia0; } >/dev/null 2>&1 && echo yes)
DEMO_EXTRAS ?= $(if $(HAVE_GPU),test$(comma)cuda12,)
# Extra arguments, e.g. `make test PYTEST_ARGS='-k paged -x'`.
PYTEST_ARGS ?=
BENCH_ARGS  ?=
BENCH_DECODE_ARGS ?=
BENCH_VARLEN_ARGS ?=
PIP_ARGS    ?=
LINT_PATHS  := $(wildcard cupy_flashattn tests examples benchmarks tools)
# ruff's classic default rules, pinned (newer ruff releases select more by default); `l` for an
# LSE is house style, and notebooks put the checkout on sys.path before importing.
RUFF_ARGS   ?= --no-cache --line-length 100 --target-version py310 --select E4,E7,E9,F \
	--ignore E741 --config "lint.per-file-ignores = {'*.ipynb' = ['E402']}"

.DEFAULT_GOAL := help
.PHONY: help install demo test test-gpu bench lint check-wheel clean-cache

help: ## List the targets
	@echo "cupy_flashattn: make <target>"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  \1\t\2/' | expand -t 16
	@echo "Variables: PYTHON=$(PYTHON) VENV=$(VENV) EXTRAS=$(EXTRAS) DEMO_EXTRAS=$(DEMO_EXTRAS) PYTEST_ARGS= BENCH_ARGS="

# The stamp's name carries the extras, so `make test EXTRAS=test,cuda13` installs again.
$(STAMP): setup.cfg pyproject.toml
	@if ! $(VPY) -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null; then \
		echo "make: creating $(VENV) with $(PYTHON) ($$($(PYTHON) --version 2>&1))"; \
		$(PYTHON) -m venv --clear $(VENV) || exit 1; \
	fi
	@covered=; for s in $(VENV)/.installed-*; do \
		if [ -f "$$s" ] && [ "$$s" -nt setup.cfg ] && [ "$$s" -nt pyproject.toml ]; then covered=$$s; fi; \
	done; \
	if [ -z "$(EXTRAS)" ] && [ -n "$$covered" ]; then \
		echo "make: the CPU set is already installed ($$covered is up to date)"; \
	else \
		echo "$(VPY) -m pip install --disable-pip-version-check -q $(PIP_ARGS) -e $(PIP_TARGET)"; \
		$(VPY) -m pip install --disable-pip-version-check -q $(PIP_ARGS) -e $(PIP_TARGET) || exit 1; \
	fi
	@if [ -n "$(EXTRAS)" ]; then \
		find $(VENV) -maxdepth 1 -name '.installed-*' ! -name '.installed-cpu' -exec rm -f {} +; \
	fi
	@touch $@

install: $(STAMP) ## Create .venv and install the package with [$(EXTRAS)], default [test,cuda12] (only when needed)

demo: ## Run examples/quickstart.py (GPU if usable, else the CPU backend, CPU wheels only)
	@echo "demo: $(if $(HAVE_GPU),NVIDIA GPU found,no NVIDIA GPU found (no nvidia-smi, no /dev/nvidia0)): installing '$(or $(DEMO_EXTRAS),the CPU set)'"
	@$(MAKE) --no-print-directory install EXTRAS='$(DEMO_EXTRAS)'
	$(VPY) examples/quickstart.py

test: $(STAMP) ## Run all tests (GPU tests are skipped without a GPU)
	$(VPY) -m pytest -q $(PYTEST_ARGS)

test-gpu: ## GPU tests only, in place with the machine's python3 (no install, no network)
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} python3 -m pytest -m gpu -q $(PYTEST_ARGS)

bench: ## Prefill (16-bit, float32/float64), decode, prefix-range and D=512 benchmarks vs torch SDPA, in place with the machine's python3
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} python3 benchmarks/bench.py $(BENCH_ARGS)
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} python3 benchmarks/bench_decode.py $(BENCH_DECODE_ARGS)
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} python3 benchmarks/bench_varlen.py $(BENCH_VARLEN_ARGS)
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} python3 benchmarks/bench_precise.py $(BENCH_PRECISE_ARGS)
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} python3 benchmarks/bench_features.py $(BENCH_FEATURES_ARGS)

lint: $(STAMP) ## ruff (when installed) and compileall over the Python sources
	@if $(VPY) -m ruff --version >/dev/null 2>&1; then \
		echo "lint: ruff check $(LINT_PATHS)"; \
		$(VPY) -m ruff check $(RUFF_ARGS) $(LINT_PATHS) || exit 1; \
	else echo "lint: ruff is not installed in $(VENV); skipping it"; fi
	$(VPY) -m compileall -q $(LINT_PATHS)
	@bash -n .ci/run && echo "lint: .ci/run parses"

check-wheel: $(STAMP) ## Build sdist+wheel, check cuda_src is inside, install in a fresh venv (CHECK_WHEEL_ARGS=--deps)
	$(VPY) tools/check_wheel.py $(CHECK_WHEEL_ARGS)

clean-cache: ## Remove our kernels from CuPy's cache (CUPY_CACHE_DIR) and Numba's
	@if [ -x $(VPY) ]; then py=$(VPY); else py=$(PYTHON); fi; $$py tools/clean_cache.py $(CLEAN_CACHE_ARGS)
