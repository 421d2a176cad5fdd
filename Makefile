# labkit: `make lab` runs the whole workshop headless; `make test` runs the test suite.
# Both do all their own set-up on a fresh machine (venv, packages, data).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup data lab test test-fast test-repeat jupyter lint gpu-wheels gpu-check

setup: $(STAMP)

# torch==2.13.0 is installed on its own first: on a CPU-only machine pip then finds the local
# CPU wheel instead of pulling a CUDA build through megatron-core's dependencies.
# The class's JupyterHub (`labkit class hub`) takes its proxy, configurable-http-proxy, from npm
# (apt-get install nodejs npm): installed under the venv, where labkit.hub looks for it.
CHP_VERSION := 5.3.0
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev,deepspeed,hub]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	@if command -v npm >/dev/null; then \
	  npm install --silent --no-fund --no-audit --prefix $(VENV)/node configurable-http-proxy@$(CHP_VERSION); \
	else echo "make setup: no npm, so no configurable-http-proxy for labkit class hub (apt-get install nodejs npm)"; fi
	touch $@

data: setup
	$(PY) code/prepare_data.py

lab: setup data
	$(VENV)/bin/labkit regress --profile cpu --backend local --out runs/lab

# The pure and fake-Slurm tests run first, in TEST_WORKERS pytest-xdist processes (0: in one
# process). Then two pytests side by side, each running its tests one after another: the tests
# that need the whole machine (the mini-cluster, Unix users, the notebooks, the browser:
# MACHINE_TIERS), and the trainings that need none of it (the engine tier's other tests; their
# output is shown when they end, and kept in $(ENGINE_LOG)). The machine's tests wait on Slurm,
# servers and browsers for about a third of their time: the trainings fill it. TEST_WORKERS=0 runs
# the two one after the other. JUNIT=PREFIX writes PREFIX-fast.xml, PREFIX-slow.xml and
# PREFIX-engine.xml. A pytest with nothing selected (exit code 5) is not a failure.
SLOW_TIERS    := slurm or engine or notebooks or browser or users or gpu
MACHINE_TIERS := slurm or notebooks or browser or users
TEST_WORKERS  ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS))
ENGINE_LOG := $(if $(JUNIT),$(JUNIT)-engine.log,runs/test-engine.log)

test: setup data
	@mkdir -p $(dir $(ENGINE_LOG)); \
	$(PY) -m pytest $(XDIST) -m "not ($(SLOW_TIERS))" $(if $(JUNIT),--junitxml=$(JUNIT)-fast.xml) \
	  $(PYTEST_ARGS); fast=$$?; \
	engine_tier() { $(PY) -m pytest -p no:cacheprovider -m "($(SLOW_TIERS)) and not ($(MACHINE_TIERS))" \
	  $(if $(JUNIT),--junitxml=$(JUNIT)-engine.xml) $(PYTEST_ARGS) > $(ENGINE_LOG) 2>&1; }; \
	if [ "$(TEST_WORKERS)" = 0 ]; then engine_tier; engine=$$?; else engine_tier & engine_pid=$$!; fi; \
	$(PY) -m pytest -m "$(MACHINE_TIERS)" $(if $(JUNIT),--junitxml=$(JUNIT)-slow.xml) $(PYTEST_ARGS); \
	slow=$$?; if [ -n "$$engine_pid" ]; then wait $$engine_pid; engine=$$?; fi; \
	echo "== the engine tier's trainings, run beside the machine's tests ($(ENGINE_LOG)):"; \
	cat $(ENGINE_LOG); \
	echo "make test: fast tiers exit $$fast, machine tiers exit $$slow, engine trainings exit $$engine"; \
	case "$$fast$$slow$$engine" in *[!05]*) exit 1;; 555) exit 5;; *) exit 0;; esac

test-fast: setup
	$(PY) -m pytest $(XDIST) -m "not ($(SLOW_TIERS))" $(PYTEST_ARGS)

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

# The GPU check (benchmarks/README.md, "GPU check"), made for a lent GPU machine that reaches no
# package registry: its own python3 (GPU_PYTHON) holds a CUDA torch; what it lacks travels as
# wheels. `make gpu-wheels` (where the registry is reachable) downloads them into gpu-wheels/;
# `make gpu-check` (on the GPU machine) stops at once where torch sees no CUDA device, else
# builds .venv-gpu over GPU_PYTHON (its packages through a .pth file: --system-site-packages
# alone does not reach them when GPU_PYTHON is itself a venv), installs the wheels and labkit
# with --no-index, prepares the data, runs the benchmark, then the gpu tests (each under its own
# time limit: about 7 minutes in all on an H100), and fails at the end if anything failed.
# Everything it measured stays in runs/gpu-check/ (results.json, figures, logs, tracebacks, pytest.txt).
GPU_PYTHON ?= python3
GPU_VENV   := .venv-gpu
GPU_PY     := $(GPU_VENV)/bin/python
GPU_OUT    := runs/gpu-check
GPU_WHEELS := gpu-wheels
# Seconds for the benchmark and for the gpu tests (on an H100: the benchmark 160 s, the tests
# about 50 s each, five of them on one GPU).
GPU_BENCH_S ?= 180
GPU_TESTS_S ?= 240
# What labkit's GPU path imports and the lent image (device KINDS.md, "Python packages already
# there") lacks; each wheel's Requires-Dist (torch, numpy, packaging) is in the image.
GPU_WHEEL_PINS := megatron-core==0.16.1 ahocorasick-rs==1.0.3
GPU_PLATFORMS  := $(foreach n,2_28 2_27 2_24 2_17,--platform manylinux_$(n)_x86_64) \
                  --platform manylinux2014_x86_64
GPU_PIP := $(GPU_PYTHON) -m pip --python $(GPU_PY) install --quiet --no-index --no-deps \
           --no-build-isolation --disable-pip-version-check

gpu-wheels:
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp $(GPU_PLATFORMS) -d $(GPU_WHEELS) $(GPU_WHEEL_PINS)
	@du -sh $(GPU_WHEELS) && ls $(GPU_WHEELS)

gpu-check:
	@$(GPU_PYTHON) benchmarks/bench_gpu.py --require-cuda
	@ls $(GPU_WHEELS)/*.whl >/dev/null || { echo "gpu-check: no wheels in $(GPU_WHEELS)/: run \
	  make gpu-wheels where the registry is reachable and carry $(GPU_WHEELS)"; exit 2; }
	rm -rf $(GPU_VENV)
	@if [ -e $(GPU_OUT) ]; then mv $(GPU_OUT) $(GPU_OUT).old-$$(date +%Y%m%d-%H%M%S) && \
	  echo "gpu-check: the earlier results moved aside to $(GPU_OUT).old-*"; fi
	mkdir -p $(GPU_OUT)
	$(GPU_PYTHON) -m venv --system-site-packages --without-pip $(GPU_VENV)
	$(GPU_PYTHON) -c "import sysconfig; print(sysconfig.get_path('purelib')); \
	  print(sysconfig.get_path('platlib'))" \
	  > "$$($(GPU_PY) -c "import sysconfig; print(sysconfig.get_path('purelib'))")/gpu-image.pth"
	$(GPU_PIP) $(GPU_WHEELS)/*.whl
	$(GPU_PIP) -e .
	$(GPU_PY) benchmarks/bench_gpu.py --check-imports
	$(GPU_PY) code/prepare_data.py > $(GPU_OUT)/prepare_data.txt 2>&1 \
	  || { cat $(GPU_OUT)/prepare_data.txt; exit 1; }
	-PYTHONUNBUFFERED=1 timeout $$(($(GPU_BENCH_S) + 20)) $(GPU_PY) benchmarks/bench_gpu.py --out $(GPU_OUT) \
	  --budget-s $(GPU_BENCH_S)
	-timeout $(GPU_TESTS_S) $(GPU_PY) -m pytest -m gpu tests/test_gpu.py -v -p no:cacheprovider \
	  --junitxml=$(GPU_OUT)/pytest.xml $(PYTEST_ARGS) > $(GPU_OUT)/pytest.txt 2>&1; \
	  tail -25 $(GPU_OUT)/pytest.txt
	$(GPU_PY) benchmarks/bench_gpu.py --summary $(GPU_OUT)
