"""What the GPU check measures and where its results go."""

from __future__ import annotations

from benchmarks.common import REPO

TITLE = "GPU check: the plan on a real GPU (memory per process, CPU nodes, learner, rendering)"
RESULT = REPO / "benchmarks" / "gpu_check.json"
# Where a run that measured nothing (no GPU) writes by default: git-ignored, so a CPU machine
# leaves the committed GPU measurement and the working tree alone.
UNMEASURED = REPO / "benchmarks" / "logs" / "gpu_check.json"
CONFIG = "configs/reacher_hard_distributed.py"
NOT_MEASURED = "not measured: no GPU machine was available"
PARTS = ("inventory", "learner", "cpu_node", "memory", "render", "shared", "reckoning")
SHARED_CONFIG = "configs/reacher_hard_gpu_layouts.py"
VARIANTS = ("planned", "defaults", "gpu_actors")
# The plan variant with actors on the GPU: a small cap each, no preallocation, so that
# each actor holds only what it uses; the learner keeps half the GPU.
GPU_ACTOR_OVERRIDES = {
    "resources.learner.gpu_memory": 0.5,
    "resources.actor.device": "gpu",
    "resources.actor.gpu_memory": 0.05,
    "resources.actor.preallocate": False,
}
READY_TIMEOUT_S = 600.0  # a first jitted update can compile for minutes on a busy machine
MIB = 1024 * 1024
