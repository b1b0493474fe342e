# The two commands: `make run` and `make test`. Both create .venv when needed and are idempotent.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The CPU build of torch that lies on this kind of machine; on a GPU host override, e.g. TORCH_SPEC=torch.
TORCH_SPEC ?= torch==2.13.0
PIP    := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: run test bench lint clean setup

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

bench: $(VENV)/.test-stamp
	$(PY) benchmarks/run_all.py

lint: $(VENV)/.test-stamp
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) .gpulens .pytest_cache

# On a machine with an NVIDIA GPU: every NVML field against nvidia-smi, the training monitor on a
# real CUDA loop, a forced OOM, GPM and XID registration; one JSON report (about 1 minute, under 4).
# On a CPU machine it says so and exits 0. Torch with CUDA: make gpu-check TORCH_SPEC=torch.
.PHONY: gpu-check
gpu-check: $(VENV)/.run-stamp
	$(PIP) '$(TORCH_SPEC)'
	$(PY) -m gpulens.gpucheck --out gpu-check.json
