# magi_lp: `make run` and `make test` set everything up on first use.
# `make setup` is cheap when nothing changed: it re-checks the JAX build for this machine
# (cpu, or cuda12 with an NVIDIA driver >= 525.60.13) and reinstalls only when the choice,
# requirements.txt, requirements-cuda12.txt, setup.py or the set-up scripts changed.
#   make setup JAX=cpu|cuda12|auto   force a JAX build (kept until JAX=auto)
VENV      ?= .venv
PY        := $(VENV)/bin/python
# The current stack (Python 3.12, jax 0.11; no Launchpad/Reverb/TF): docs/setup.md.
VENV312   ?= .venv312
PY312     := $(VENV312)/bin/python
# What the current-stack leg of `make test` runs: the placement layer and the memory
# reckoning, checkpoints on its orbax, the replays (Reverb's and the served ones), the
# learner's asynchronous dispatch (skipped on jax 0.4.30's synchronous CPU), Acme's seam, the
# builder protocol, config errors, the agents' single-process runs (tests/test_current_stack.py),
# the distributed program on Ray (tests/test_ray_engine.py) and in a real SLURM job
# (tests/test_ray_slurm.py), the learn check at a tiny size with its negative controls
# (tests/test_learn_check.py) and the GPU machine's stack: the GPU check's workers on an
# injected GPU (tests/test_gpu_check.py), `make gpu-learn` and `make gpu-system` at a tiny
# size (tests/test_gpu_learn.py, tests/test_gpu_system.py), and the status view on a terminal
# and the curves' plot (tests/test_monitor.py, tests/test_plot.py).
PY312_TESTS ?= tests/test_plan.py tests/test_resources.py tests/test_gpu_inventory.py \
	tests/test_checkpointing.py tests/test_replay_plan.py tests/test_transition_replay.py \
	tests/test_learner.py tests/test_drq_learning.py tests/test_current_stack.py \
	tests/test_memory_reckoning.py \
	tests/test_learn_check.py tests/test_acme_seam.py \
	tests/test_served_replay.py tests/test_replay_stores.py tests/test_builder_protocol.py \
	tests/test_config_errors.py tests/test_ray_engine.py tests/test_gpu_system.py tests/test_ray_slurm.py \
	tests/test_interrupts.py tests/test_gpu_check.py tests/test_gpu_learn.py \
	tests/test_monitor.py tests/test_plot.py tests/test_engine_registry.py \
	tests/test_fault_table.py tests/test_ray_faults.py
JAX       ?=
WORKDIR   ?= runs/reacher_hard_distributed
CONFIG    ?= configs/reacher_hard_distributed.py
PYTEST_ARGS ?=
# The GPU check also runs on a GPU machine with only a system Python and its own CUDA JAX
# (no Launchpad/Reverb/TF): `make gpu-check GPU_CHECK_PYTHON=python3` (benchmarks/README.md).
GPU_CHECK_PYTHON ?= $(PY)
GPU_CHECK_ARGS ?=
GPU_LEARN_ARGS ?=
# `make gpu-system` runs on the current stack (Ray): .venv312 here, `GPU_SYSTEM_PYTHON=python3` on
# a GPU machine whose Python 3.12 has its own CUDA JAX and the carried .whl-system/ wheels.
GPU_SYSTEM_PYTHON ?= $(PY312)
GPU_SYSTEM_ARGS ?=
# `make learn-check`: a checkout of facebookresearch/drqv2 (at c0c650b; never committed here)
# and the tasks. The seeds are preregistered (benchmarks/learn_check/settings.py SEEDS);
# SEEDS= runs others too, which are not counted. Runs kept are not repeated; cut ones resume.
DRQV2     ?= ../drqv2
SEEDS     ?=
TASKS     ?= cartpole_balance

.PHONY: setup setup312 run test test-launchpad test-current test-fast lint format docs bench bench-quick gpu-check gpu-learn gpu-learn-check gpu-system gpu-check-wheels gpu-learn-wheels gpu-system-wheels golden clean slurm-up slurm-down learn-check

setup:
	@bash scripts/setup_venv.sh $(VENV) $(JAX)

setup312:
	@bash scripts/setup_venv312.sh $(VENV312)

run: setup
	$(PY) projects/drq_v2/lp_main.py --config $(CONFIG) --workdir $(WORKDIR)

# Both stacks at once: the whole suite on the Launchpad stack, and the current-stack leg
# beside it (scripts/test_both_stacks.sh says why and how); each leg alone is below.
test: setup setup312
	@PY=$(PY) PY312=$(PY312) PY312_TESTS="$(PY312_TESTS)" PYTEST_ARGS="$(PYTEST_ARGS)" \
		bash scripts/test_both_stacks.sh

test-launchpad: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-current: setup312
	$(PY312) -m pytest $(PY312_TESTS) $(PYTEST_ARGS)

# The unit tests only (no test marked `integration`: nothing that starts Launchpad, Reverb
# servers, the entry points, or a Python process of its own that imports TensorFlow, JAX or
# wandb), for the edit-test loop; `make test` still runs everything.
test-fast: setup
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# What the docs show of the tree, of the results and of the commands, regenerated (after moving
# a module, adding a package, results.json changing, or a message changing): docs/architecture.md's
# module table, docs/development.md's Layout, docs/results.md's headline table and the command
# samples of README.md and docs/*.md, each from running its command now (about a minute: two
# compile DrQ-v2's update) (tests/test_architecture_doc.py, tests/test_readme.py).
docs: setup
	$(PY) scripts/module_table.py --write
	$(PY) scripts/readme_layout.py --write
	$(PY) -m benchmarks.run --readme
	$(PY) scripts/readme_samples.py --write

bench: setup
	$(PY) -m benchmarks.run

bench-quick: setup
	$(PY) -m benchmarks.run --quick

# Regenerates tests/golden/cluster (the SLURM script, Kubernetes manifests and per-host
# scripts that --render writes for configs/cluster_example.py); review the diff, commit it.
golden: setup
	$(PY) -m magi_lp.cluster --golden

# A SLURM cluster of three nodes on this machine (root; installs slurm-wlm and munge once),
# as the tests start it: its folder, where each command runs, is printed (docs/cluster.md).
slurm-up:
	$(or $(wildcard $(PY)),python3) scripts/slurm_cluster.py up

# Stops it by the PIDs recorded in its folder and removes the folder (SLURM_DIR=: one of several).
slurm-down:
	$(or $(wildcard $(PY)),python3) scripts/slurm_cluster.py down $(SLURM_DIR)

# This DrQ-v2 (one process, .venv312, device store) beside the official PyTorch one at the
# same reduced settings, one core each, the preregistered seeds x TASKS: BENCHMARKS.md's
# learning-check figure. Exit 0: the goal held; 1: not; 3: runs unfinished (run it again: they
# resume). In the background, detached: bash benchmarks/learn_check/background.sh $(DRQV2).
# The official agent's venv (.venv-official, Python 3.11, CPU torch) is set up on first use.
learn-check: setup setup312
	bash scripts/setup_official_venv.sh .venv-official
	$(PY) -m benchmarks.learn_check --official $(DRQV2) --tasks $(TASKS) $(if $(SEEDS),--seeds $(SEEDS))

# Set up the venv only when the check runs with it.
gpu-check: $(if $(filter $(PY),$(GPU_CHECK_PYTHON)),setup)
	$(GPU_CHECK_PYTHON) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

# DrQ-v2 learning from pixels beside the official agent's published curves: 3 seeds side by
# side on one GPU at the paper's settings on cartpole_balance, to 60k frames or 7 minutes (one
# device call of <= 8 minutes); tiny without a GPU.
gpu-learn: $(if $(filter $(PY),$(GPU_CHECK_PYTHON)),setup)
	$(GPU_CHECK_PYTHON) -m benchmarks.gpu_learn $(GPU_LEARN_ARGS)

# The preregistered comparisons at those settings (3 seeds of each agent, to 40k frames) over
# the gpu_learn.json files committed under benchmarks/gpu_learn_check/ and the CPU runs kept in
# its cpu/ (learn_check --paper): exit 0 held, 1 not held, 3 incomplete. Needs no GPU (it reads
# results); writes benchmarks/gpu_learn_check.json and the PNG, then figure 17 of BENCHMARKS.md.
gpu-learn-check: setup
	$(PY) -m benchmarks.gpu_learn_check --write; code=$$?; \
		$(PY) -m benchmarks.run --only gpu_learn_check >/dev/null && exit $$code

# The cp312 wheels the GPU check needs on a GPU machine without network, into .whl/.
gpu-check-wheels:
	bash scripts/gpu_check_wheels.sh .whl

# The cp312 wheels `make gpu-learn` needs there (dm_control, mujoco, Haiku, dm-acme, ...), into
# .whl-learn/ (benchmarks/README.md, "The learning run").
gpu-learn-wheels: setup
	bash scripts/gpu_learn_wheels.sh .whl-learn

# The whole distributed DrQ-v2 on Ray on one GPU (benchmarks/gpu_system.py): cartpole_balance at
# the paper's settings in configs/reacher_hard_gpu_layouts.py's 1-GPU layout for 4 minutes, then
# SIGINT: frames/s, the learner against the update alone, NVML memory per process against the
# reckoning, returns against the official curves; one device call of <= 9 minutes
# (benchmarks/README.md, "The whole system on a GPU"). Tiny on the CPU without a GPU.
gpu-system: $(if $(filter $(PY312),$(GPU_SYSTEM_PYTHON)),setup312)
	$(GPU_SYSTEM_PYTHON) -m benchmarks.gpu_system $(GPU_SYSTEM_ARGS)

# The cp312 wheels `make gpu-system` needs there (gpu-learn's, slimmer, and Ray without its Java
# jars), into .whl-system/; prints each size and the device call's total (<= 64 MiB).
gpu-system-wheels: setup
	bash scripts/gpu_system_wheels.sh .whl-system

clean:
	rm -rf $(VENV) $(VENV312) .pytest_cache .ruff_cache
