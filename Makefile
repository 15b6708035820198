# magi_lp: `make run` and `make test` set everything up on first use.
# `make setup` is cheap when nothing changed: it re-checks the JAX build for this machine
# (cpu, or cuda12 with an NVIDIA driver >= 525.60.13) and reinstalls only when the choice,
# requirements.txt, requirements-cuda12.txt, setup.py or the set-up scripts changed.
#   make setup JAX=cpu|cuda12|auto   force a JAX build (kept until JAX=auto)
VENV      ?= .venv
PY        := $(VENV)/bin/python
JAX       ?=
WORKDIR   ?= runs/reacher_hard_distributed
CONFIG    ?= configs/reacher_hard_distributed.py
PYTEST_ARGS ?=
# The GPU check also runs on a GPU machine with only a system Python and its own CUDA JAX
# (no Launchpad/Reverb/TF): `make gpu-check GPU_CHECK_PYTHON=python3` (benchmarks/README.md).
GPU_CHECK_PYTHON ?= $(PY)
GPU_CHECK_ARGS ?=
GPU_LEARN_ARGS ?=

.PHONY: setup run test lint format bench bench-quick gpu-check gpu-learn gpu-check-wheels golden clean

setup:
	@bash scripts/setup_venv.sh $(VENV) $(JAX)

run: setup
	$(PY) projects/drq_v2/lp_main.py --config $(CONFIG) --workdir $(WORKDIR)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: setup
	$(PY) -m benchmarks.run

bench-quick: setup
	$(PY) -m benchmarks.run --quick

# Regenerates tests/golden/cluster (the SLURM script, Kubernetes manifests and per-host
# scripts that --render writes for configs/cluster_example.py); review the diff, commit it.
golden: setup
	$(PY) -m magi_lp.runtime.cluster --golden

# Set up the venv only when the check runs with it.
gpu-check: $(if $(filter $(PY),$(GPU_CHECK_PYTHON)),setup)
	$(GPU_CHECK_PYTHON) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

# DrQ-v2 learning from pixels in one process (device replay) beside the official agent's
# published curves: cartpole_balance to 100k frames, then cartpole_swingup; tiny without a GPU.
gpu-learn: $(if $(filter $(PY),$(GPU_CHECK_PYTHON)),setup)
	$(GPU_CHECK_PYTHON) -m benchmarks.gpu_learn $(GPU_LEARN_ARGS)

# The cp312 wheels the GPU check needs on a GPU machine without network, into .whl/.
gpu-check-wheels:
	bash scripts/gpu_check_wheels.sh .whl

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
