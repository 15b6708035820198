"""DrQ-v2 on reacher/hard, distributed: what `make run` launches.

Four CPU actors (one thread each, EGL rendering), one CPU evaluator, the learner on a GPU
when the machine has one (otherwise on the CPU, with a one-line notice in the plan),
replay, counter and coordinator on the CPU. The paper's hyperparameters; see
projects/drq_v2/tasks.py and docs/architecture.md for every key.

Its replay (1M transitions of 84x84x3 frames) is `replay.store='auto'`: the device store
(21.9 GB) where the learner's device has room, else the compressed host store ('host', about
5.5 GB of zstd frames in the learner's host memory: what a 24 GiB machine gets), else Reverb's
frame replay ('reverb', Launchpad only). The dry run's `replay:` line says which, and why.

python projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py --dry_run
python projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py \
    --workdir runs/reacher_hard_distributed
"""

from projects.drq_v2.tasks import make_config


def get_config():
    return make_config("reacher_hard", distributed=True)
