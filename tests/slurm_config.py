"""A tiny program on the three nodes of the test SLURM cluster (scripts/slurm_cluster.py).

    --config tests/slurm_config.py        DrQ-v2 (add projects/drq_v2/tiny.py's flags)
    --config tests/slurm_config.py:td3    TD3 on cartpole from states (configs/td3_cartpole.py)
    --config tests/slurm_config.py:td3+spare   TD3 on four hosts (the evaluator on `spare`):
                                          one more than the cluster has nodes

Three hosts, one SLURM node each (SLURM picks which; no address in the config, so every
node finds the others at the allocated node's NodeAddr): `learner` runs the learner;
`server` the replay, the counter and the coordinator; `acting` two actors and the evaluator.
The nodes all share this machine, and their servers listen on every address, so each host
gets its own port range (100 ports: a Ray node's ports come from it too).
"""

import importlib.util
from pathlib import Path

from magi_lp.cluster.config import hosts_defaults, machine

BASE_PORT = 24600
PLACE = {
    "learner": "learner",
    "replay": "server",
    "counter": "server",
    "coordinator": "server",
    "actor": "acting",
    "evaluator": "acting",
}


def _td3_config():
    path = Path(__file__).resolve().parents[1] / "configs/td3_cartpole.py"
    spec = importlib.util.spec_from_file_location("_td3_cartpole_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config(argument: str = "drq"):
    agent, _, extra = argument.partition("+")
    if agent == "td3":
        config = _td3_config()
    else:
        from projects.drq_v2.tasks import make_config

        config = make_config("reacher_hard", distributed=True)
    config.num_actors = 2
    config.hosts = hosts_defaults()
    config.hosts.name = f"slurm-{agent}"
    for offset, host in enumerate(("learner", "server", "acting")):
        config.hosts.machines[host] = machine(base_port=BASE_PORT + 100 * offset, gpus=0)
    for group, host in PLACE.items():
        config.hosts.place[group] = host
    if extra == "spare":
        config.hosts.machines.spare = machine(base_port=BASE_PORT + 300, gpus=0)
        config.hosts.place.evaluator = "spare"
    # Quick fault detection and stop for a test; a cluster keeps the defaults.
    config.hosts.poll_seconds = 0.25
    config.hosts.heartbeat_timeout_seconds = 20.0
    config.hosts.stop_notice_seconds = 8.0
    config.hosts.start_timeout_seconds = 240.0
    return config
