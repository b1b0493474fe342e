# The two commands: `make run` and `make test`. Both create .venv when needed and are idempotent.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check
# Every install comes from a lock file: pinned, hashed, --no-deps (nothing resolves by accident), then `pip check`.
LOCKED := $(PIP) --no-deps --require-hashes -r
# torch sits outside requirements-test.txt: by default the CPU build that lies on this kind of machine, checked
# against its hash (requirements-torch.txt). On a GPU host name your build on purpose, e.g.
# `make test TORCH_SPEC=torch==2.13.0`: pip then resolves that build's own dependencies (its CUDA libraries).
TORCH_SPEC ?=
ifeq ($(strip $(TORCH_SPEC)),)
TORCH_INSTALL := $(LOCKED) requirements-torch.txt
else
TORCH_INSTALL := $(PIP) '$(TORCH_SPEC)'
endif

.PHONY: run test bench lint clean setup lock reliability

$(PY):
	$(PYTHON) -m venv $(VENV)

# Runtime set-up: the package with its web and plot extras, at the versions in requirements.txt.
$(VENV)/.run-stamp: requirements.txt pyproject.toml | $(PY)
	$(LOCKED) requirements.txt
	$(PIP) --no-deps -e .
	$(PY) -m pip check
	touch $@

# Test set-up: everything run needs, plus torch and the test tools, at the versions in requirements-test.txt.
$(VENV)/.test-stamp: $(VENV)/.run-stamp requirements-test.txt requirements-torch.txt pyproject.toml
	$(TORCH_INSTALL)
	$(LOCKED) requirements-test.txt
	$(PY) -m pip check
	touch $@

# Refresh the lock files on purpose (newest versions pyproject.toml's ranges allow), then run `make test`.
lock:
	.ci/lock

setup: $(VENV)/.test-stamp

run: $(VENV)/.run-stamp
	$(VENV)/bin/gpulens demo

# ruff first: it also keeps pynvml imports inside gpu/nvml.py (the one NVML seam).
# The suite runs in TEST_WORKERS pytest-xdist workers, a file to a worker (module fixtures such as the
# scrape rig start once): most of its time is waiting on real servers, so 4 workers on CI's 2 cores take
# about 8 minutes where one takes 18. TEST_WORKERS=0 runs it in this process, in file order.
TEST_WORKERS ?= 4
test: $(VENV)/.test-stamp
	$(VENV)/bin/ruff check src tests benchmarks examples deploy
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The reliability suite at full strength (tests/reliability; a short version runs in `make test`):
# 24 kill -9s, every interrupting signal, 1,000 fuzz examples per parser, a 30-minute soak at
# 8 GPUs x 10 Hz (SOAK=120 for the short one). Figures: tests/reliability/soak.json.
SOAK ?= 1800
reliability: $(VENV)/.test-stamp
	GPULENS_RELIABILITY_FULL=1 GPULENS_KILLS=24 GPULENS_FUZZ_EXAMPLES=1000 GPULENS_SOAK_SECONDS=$(SOAK) \
	GPULENS_SOAK_REPORT=tests/reliability/soak.json $(PY) -m pytest -q -s -p no:cacheprovider --timeout=$$(( $(SOAK) + 900 )) \
	  tests/reliability tests/web/test_connection_limits.py

bench: $(VENV)/.test-stamp
	$(PY) benchmarks/run_all.py

lint: $(VENV)/.test-stamp
	$(VENV)/bin/ruff check src tests benchmarks examples deploy

clean:
	rm -rf $(VENV) .venv-llm-analysis .gpulens .pytest_cache

# On a machine with an NVIDIA GPU: every NVML field against nvidia-smi, the training monitor on a
# real CUDA loop, a forced OOM, GPM and XID registration; one JSON report (about 1 minute, under 4).
# On a CPU machine it says so and exits 0. Torch with CUDA: make gpu-check TORCH_SPEC=torch.
.PHONY: gpu-check
gpu-check: $(VENV)/.run-stamp
	$(if $(strip $(TORCH_SPEC)),$(PIP) '$(TORCH_SPEC)')
	$(PY) -m gpulens.gpucheck --out gpu-check.json
