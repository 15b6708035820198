"""DrQ-v2 on reacher/hard, distributed: what `make run` launches.

Four CPU actors (one thread each, EGL rendering), one CPU evaluator, the learner on a GPU
when the machine has one (otherwise on the CPU, with a one-line notice in the plan),
replay, counter and coordinator on the CPU. The paper's hyperparameters; see
projects/drq_v2/tasks.py and docs/architecture.md for every key.

python projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py --dry_run
python projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py \
    --workdir runs/reacher_hard_distributed
"""

from projects.drq_v2.tasks import make_config


def get_config():
    return make_config("reacher_hard", distributed=True)
