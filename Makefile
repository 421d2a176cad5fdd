# labkit: `make lab` runs the whole workshop headless; `make test` runs the test suite.
# Both do all their own set-up on a fresh machine (venv, packages, data).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup data lab test test-fast test-repeat jupyter lint gpu-check

setup: $(STAMP)

# torch==2.13.0 is installed on its own first: on a CPU-only machine pip then finds the local
# CPU wheel instead of pulling a CUDA build through megatron-core's dependencies.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev,deepspeed]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

data: setup
	$(PY) code/prepare_data.py

lab: setup data
	$(VENV)/bin/labkit regress --profile cpu --backend local --out runs/lab

test: setup data
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -m "not slurm and not engine and not notebooks and not browser" $(PYTEST_ARGS)

# The fast tiers N times, each in its own shuffled order, beside HOGS busy processes: names every
# test that failed even once (benchmarks/README.md, "A suite you can trust").
N    ?= 20
HOGS ?= 0
test-repeat: setup data
	$(PY) benchmarks/repeat_tests.py --runs $(N) --hogs $(HOGS)

# JupyterLab refuses to run as root unless told; root is what containers, cloud VMs and CI give.
jupyter: setup data
	$(VENV)/bin/jupyter lab notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

lint: setup
	$(VENV)/bin/ruff check labkit code tests benchmarks

# The GPU check (benchmarks/README.md, "GPU check"): gpu-marked tests, then the GPU benchmark.
# Stops at once with a clear message where torch sees no CUDA device.
gpu-check: setup
	@$(PY) benchmarks/bench_gpu.py --require-cuda
	$(PY) code/prepare_data.py
	$(PY) -m pytest -m gpu tests/test_gpu.py $(PYTEST_ARGS)
	$(PY) benchmarks/bench_gpu.py
