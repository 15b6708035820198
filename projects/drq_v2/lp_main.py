"""DrQ-v2 distributed with Launchpad: replay, counter, learner, actors, evaluator, coordinator.

python projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py --dry_run
python projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py \
    --workdir runs/reacher_hard_distributed
"""

from magi_lp import distributed_main
from projects.drq_v2.config import validate_config


def make_experiment(config, workdir=None):
    # Imported on use: a dry run or a bad flag never pays for JAX/TF/MuJoCo imports.
    from projects.drq_v2.experiment import make_experiment as make

    return make(config, workdir=workdir)


if __name__ == "__main__":
    distributed_main(make_experiment, validate_config=validate_config)
