"""DrQ-v2 on reacher/hard, distributed: what `make run` launches.

CPU actors sized to the machine (`num_actors='auto'`: one thread each, EGL rendering), one
CPU evaluator, the learner on a GPU when the machine has one (otherwise on the CPU, with a
one-line notice in the plan), replay, counter and coordinator on the CPU. The paper's
hyperparameters; see projects/drq_v2/tasks.py and docs/architecture.md for every key.

Its replay (1M transitions of 84x84x3 frames) is `replay.store='auto'`: the device store
(21.9 GB) where the learner's device has room, else Reverb's frame replay where the engine
carries Reverb ('reverb', Launchpad: what `make run` gets on a 24 GiB machine), else the
compressed host store ('host', about 5.5 GB of zstd frames in the learner's host memory: what
the current stack gets there). The dry run's `replay:` line says which, and why.

python projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py --dry_run
python projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py \
    --workdir runs/reacher_hard_distributed
"""

from projects.drq_v2.tasks import make_config


def get_config():
    config = make_config("reacher_hard", distributed=True)
    # As many actors as this machine's cores (and RAM) allow beside the learner, replay,
    # evaluator and counter, one environment each (CPU actors): the dry run's `actors:` line
    # says how many and why. A number keeps that many (--config.num_actors=4).
    config.num_actors = "auto"
    config.envs_per_actor = "auto"
    return config
