"""DrQ-v2 in one process (debugging, determinism checks, small machines).

python projects/drq_v2/main.py --config configs/reacher_hard.py --workdir runs/reacher_hard
"""

from magi_lp import single_process_main
from projects.drq_v2.config import validate_config


def make_experiment(config, workdir=None):
    # Imported on use: a bad flag never pays for JAX/TF/MuJoCo imports.
    from projects.drq_v2.experiment import make_experiment as make

    return make(config, workdir=workdir)


if __name__ == "__main__":
    single_process_main(make_experiment, validate_config=validate_config)
