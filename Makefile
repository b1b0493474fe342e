# The two commands: `make run` and `make test`. Both create .venv when needed and are idempotent.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The CPU build of torch that lies on this kind of machine; on a GPU host override, e.g. TORCH_SPEC=torch.
TORCH_SPEC ?= torch==2.13.0
PIP    := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: run test bench lint clean setup reliability

$(PY):
	$(PYTHON) -m venv $(VENV)

# Runtime set-up: the package with its web and plot extras.
$(VENV)/.run-stamp: pyproject.toml | $(PY)
	$(PIP) -e '.[web,plot]'
	touch $@

# Test set-up: everything run needs, plus torch (CPU) and the test tools.
$(VENV)/.test-stamp: $(VENV)/.run-stamp pyproject.toml
	$(PIP) '$(TORCH_SPEC)'
	$(PIP) -e '.[web,plot,torch,dev]'
	touch $@

setup: $(VENV)/.test-stamp

run: $(VENV)/.run-stamp
	$(VENV)/bin/gpulens demo

# ruff first: it also keeps pynvml imports inside gpu/nvml.py (the one NVML seam).
test: $(VENV)/.test-stamp
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -q

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
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) .gpulens .pytest_cache
