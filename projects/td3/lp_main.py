"""TD3 distributed with Launchpad: replay, counter, learner, actors, evaluator, coordinator.

python projects/td3/lp_main.py --config configs/td3_cartpole.py --workdir runs/td3_lp
python projects/td3/lp_main.py --config configs/td3_cartpole.py --dry_run
"""

from magi_lp.cli import distributed_main
from projects.td3.environment import make_experiment

if __name__ == "__main__":
    distributed_main(make_experiment)
