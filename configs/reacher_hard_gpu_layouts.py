"""DrQ-v2 on reacher/hard, distributed, laid out on a GPU machine: actors and learner split.

python projects/drq_v2/lp_main.py --config configs/reacher_hard_gpu_layouts.py:1gpu --dry_run
python projects/drq_v2/lp_main.py --config configs/reacher_hard_gpu_layouts.py:4gpu --dry_run

The dry run prints the split in Cleanba's notation above the plan (a = actor devices,
l = learner devices). Both layouts act on the GPU with batched inference: each actor process
steps `envs_per_actor` environments and chooses all their actions in one call, because every
process that touches CUDA pays 300-700 MB for its context and a GPU runs one kernel after
another anyway (rlstructures' advice: few acting processes, many environments each).

Every GPU node's memory is `gpu_memory='auto'`: before launch the plan compiles the learner's
update and an actor's batched policy step, and gives each node the fraction its programs,
state and replay store need plus a margin (README, "GPU memory"); the dry run shows the
reckoning and what is left on each GPU, and a layout that does not fit is refused in one line.

Both size their actors to the machine (`num_actors='auto'`, `envs_per_actor='auto'`: 8
environments each, as many processes as the cores left beside the learner, replay,
evaluator and counter allow, within the GPU memory each needs); a number keeps that many.

1gpu  `a0-l0`: one GPU shared by all. The learner's memory is preallocated (its device store
      of 1M transitions is most of it); the actor processes of 8 environments each allocate
      as they need, up to their reckoning. The evaluator acts on the CPU. Measured on an
      H200 with 16 cores (`make gpu-system`, this layout on cartpole_balance, figure 15, with
      --config.num_actors=2): the two actors made 217 steps/s, each on 91% of its core, so
      the replay ratio held the learner to 0.44 of its update alone (244 updates/s); about 5
      such actors would feed it. 'auto' gives 11 there (16 cores, 5 taken by the others).
4gpu  `a0-l1,2`: actors on GPU 0 (processes of 8 environments), the learner
      data-parallel over GPUs 1 and 2 (each update's batch of 256 split 128 + 128, gradients
      averaged, parameters replicated, one store shard per GPU; the plan checks that the two
      GPUs are one model), the evaluator on GPU 3. Cleanba's 4-GPU layout puts the learner
      on 1,2,3; the paper's batch of 256 does not split over 3 devices, which the plan
      refuses by name
      (--config.resources.learner.gpus=[1,2,3] --config.agent.batch_size=255 would run).

Every other setting is the paper's (projects/drq_v2/tasks.py); on a machine without the GPUs
named here the plan refuses to start and says which are missing.
"""

from magi_lp import ConfigError, resource_spec
from projects.drq_v2.tasks import make_config

LAYOUTS = ("1gpu", "4gpu")


def get_config(layout: str = "1gpu"):
    if layout not in LAYOUTS:
        raise ConfigError(
            f"config argument {layout!r} is not a layout; use "
            f"configs/reacher_hard_gpu_layouts.py:{' or :'.join(LAYOUTS)}"
        )
    config = make_config("reacher_hard", distributed=True)
    resources = config.resources
    # Actors sized to the machine: as many as the cores left beside the learner, replay,
    # evaluator and counter allow (and the GPU memory: each holds a CUDA context, its policy's
    # pool and 80 MiB per environment rendering), 8 environments each (magi_lp.placement.
    # actor_sizing). The dry run's `actors:` line says how many and why.
    config.num_actors = "auto"
    config.envs_per_actor = "auto"
    if layout == "1gpu":
        resources.learner = resource_spec(device="gpu", gpus=[0], gpu_memory="auto", render="none")
        resources.actor = resource_spec(
            device="gpu", gpus=[0], gpu_memory="auto", preallocate=False, cpu_threads=1
        )
    else:
        resources.learner = resource_spec(
            device="gpu", gpus=[1, 2], gpu_memory="auto", render="none"
        )
        resources.actor = resource_spec(
            device="gpu", gpus=[0], gpu_memory="auto", preallocate=False, cpu_threads=1
        )
        resources.evaluator = resource_spec(
            device="gpu", gpus=[3], gpu_memory="auto", preallocate=False, cpu_threads=1
        )
    return config
