"""DrQ-v2 on reacher/hard over three hosts: the recipe of docs/cluster.md.

Host `main` (one GPU, 16 cores) runs the learner on its GPU, the replay, the counter, the
evaluator and the coordinator; hosts `cpu1` and `cpu2` run eight actors each. The same
config serves every launcher; `get_config(launcher)` only fills in what one of them needs:
- `:hosts`: the private-network addresses of the three hosts (10.0.0.2-4 here);
- `:slurm` (or nothing): no addresses, SLURM gives the nodes;
- `:kubernetes`: the same; each node is a pod, `node_selector` picks the machines.

python projects/drq_v2/lp_main.py --config configs/cluster_example.py:slurm \\
    --workdir /shared/runs/cluster_example --launcher slurm --dry_run

tests/golden/cluster/ holds what `--render` writes for each launcher
(`python -m magi_lp.cluster --golden` rewrites it).
"""

from magi_lp.cluster.config import hosts_defaults, machine
from projects.drq_v2.tasks import make_config

ADDRESSES = {"main": "10.0.0.2", "cpu1": "10.0.0.3", "cpu2": "10.0.0.4"}


def get_config(launcher: str = ""):
    config = make_config("reacher_hard", distributed=True)
    config.num_actors = 16
    # The learner alone on main's GPU with JAX's default share: gpu_memory='auto' (the task
    # configs' default) is reckoned by the one-machine launcher only; on several hosts it
    # would allocate on demand.
    config.resources.learner.gpu_memory = None
    config.hosts = hosts_defaults()
    hosts = config.hosts
    hosts.name = "drq-reacher"
    hosts.machines.main = machine(
        gpus=1, gpu_model="NVIDIA A100-SXM4-40GB", cpus=16, node_selector="magi-lp/pool=gpu"
    )
    hosts.machines.cpu1 = machine(cpus=8, node_selector="magi-lp/pool=cpu")
    hosts.machines.cpu2 = machine(cpus=8, node_selector="magi-lp/pool=cpu")
    if launcher == "hosts":
        for name, address in ADDRESSES.items():
            hosts.machines[name].address = address
    for group in ("replay", "counter", "learner", "evaluator", "coordinator"):
        hosts.place[group] = "main"
    hosts.place.actor = "cpu1,cpu2"
    hosts.slurm.time = "24:00:00"
    hosts.slurm.setup = "module load cuda/12.6"
    hosts.kubernetes.image = "registry.example.org/magi-lp:latest"
    hosts.kubernetes.namespace = "rl"
    hosts.kubernetes.volume_claim = "magi-lp-shared"
    hosts.kubernetes.volume_mount = "/shared"
    return config
