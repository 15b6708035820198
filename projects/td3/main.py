"""TD3 in one process (debugging, determinism checks, small machines).

python projects/td3/main.py --config configs/td3_cartpole.py --workdir runs/td3
"""

from magi_lp import single_process_main
from projects.td3.config import validate_config


def make_experiment(config):
    # Imported on use: a bad flag never pays for JAX/TF/MuJoCo imports.
    from projects.td3.experiment import make_experiment as make

    return make(config)


if __name__ == "__main__":
    single_process_main(make_experiment, validate_config=validate_config)
