"""TD3 in one process (debugging, determinism checks, small machines).

python projects/td3/main.py --config configs/td3_cartpole.py --workdir runs/td3
"""

from magi_lp.cli import single_process_main
from projects.td3.environment import make_experiment

if __name__ == "__main__":
    single_process_main(make_experiment)
