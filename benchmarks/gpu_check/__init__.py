"""Figure 7, the GPU check: measures on a real GPU what magi_lp promises there.

    make gpu-check                              # the venv's Python
    make gpu-check GPU_CHECK_PYTHON=python3     # a GPU machine's own Python and CUDA JAX
    python -m benchmarks.gpu_check [--quick] [--out FILE] [--max-actors N] [--parts a,b]

It writes benchmarks/gpu_check.json; `python -m benchmarks.run --only gpu_check` renders figure 7
of BENCHMARKS.md from it. Parts (all by default):

  inventory  the NVML inventory (models, memory, driver), the JAX build, and the plan of
             configs/reacher_hard_distributed.py on that machine (the dry run's table).
  learner    DrQ-v2 learner updates/s at batch 256, 84x84x9, in a process with the plan's
             learner env, fed the frame replay's batches (each item's unique frames,
             stacked in the update) through the learner's device prefetcher; the first call
             (compile) timed apart; also the update alone on a batch already on the device,
             and with a host batch copied by each call (no prefetch).
  cpu_node   a process with the plan's env for a CPU node (an actor) running the policy
             forward: whether NVML lists it on any GPU (the promise: no CUDA context).
  memory     GPU MiB per process (NVML, by pid) of one learner plus N actors (N = 1, 2, 4, ...
             up to --max-actors), started as plain subprocesses, each running its real
             workload (the jitted update for the learner, the jitted policy forward for actors),
             in three variants: `planned` (the plan's env), `defaults` (no overrides: JAX's
             defaults) and `gpu_actors` (a plan variant that puts the actors on the learner's
             GPU with gpu_memory=0.05 and no preallocation). Reported: the largest N that ran
             (measured), and the largest N the GPU's memory would hold, computed from the
             measured per-process MiB (labelled as computed).
  render     MuJoCo EGL frames/s at 84x84 (a small inline scene; dm_control is not needed) in
             a process whose plan renders on the GPU (render_gpu=0), with the GL renderer
             string that says where it ran. Skipped, saying why, where MuJoCo is missing.
  shared     the 1-GPU shared layout of configs/reacher_hard_gpu_layouts.py:1gpu (`a0-l0`):
             its learner (0.6 of the GPU) and its GPU actors (at most 0.1 each, each choosing
             the actions of `envs_per_actor` environments in one batched call) run at once
             on the first GPU, each in its own process with the plan's env: GPU MiB per
             process, learner updates/s and actions/s per actor while they share it (the
             layout's 2 actors, or --max-actors if fewer).
  reckoning  `gpu_memory='auto'`: for `make run`'s config and the 1-GPU layout, each reckoned
             node's bytes (the plan's reckoning) against the peak NVML lists for a process
             doing that node's real work at its reckoned limit (learner: the device store at
             full capacity and its updates; actors: the batched policy step), and JAX's
             `peak_bytes_in_use` (`reckoning`). Needs Haiku and dm_control (skipped, saying
             why, where they are missing). Not yet run on a GPU.

Modules: `settings` (what is measured, where results go), `workloads` (what a worker process
runs), `harness` (starting workers, NVML memory by process), `plan` (the config and placement
plan under test), `parts` (the measurements), `report` (terminal lines and BENCHMARKS.md's
figure 7), `cli` (the command line). Every worker is this package run again as
`--worker learner|actor|render` in a fresh process with os.environ plus its group's env.
Nothing here imports Launchpad, Reverb, TensorFlow, Acme, dm_env or dm_control, so the check
runs where only Python, CUDA JAX and the small wheels of scripts/gpu_check_wheels.sh are
installed. Without a GPU it prints one line and exits 0.
"""

from benchmarks.gpu_check.report import report, summary
from benchmarks.gpu_check.settings import NOT_MEASURED, RESULT, TITLE

__all__ = ["NOT_MEASURED", "RESULT", "TITLE", "report", "summary"]
