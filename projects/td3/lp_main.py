"""TD3 distributed with Launchpad: replay, counter, learner, actors, evaluator, coordinator.

python projects/td3/lp_main.py --config configs/td3_cartpole.py --workdir runs/td3_lp
python projects/td3/lp_main.py --config configs/td3_cartpole.py --dry_run
"""

from magi_lp import distributed_main
from projects.td3.config import validate_config


def make_experiment(config):
    # Imported on use: a dry run or a bad flag never pays for JAX/TF/MuJoCo imports.
    from projects.td3.experiment import make_experiment as make

    return make(config)


if __name__ == "__main__":
    distributed_main(make_experiment, validate_config=validate_config)
