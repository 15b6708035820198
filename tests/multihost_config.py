"""The tiny DrQ-v2 program on three loopback "hosts", for tests/test_cluster_e2e.py.

`main` (127.0.0.2) runs replay, counter, learner, evaluator and coordinator; `a1`
(127.0.0.3) and `a2` (127.0.0.4) one actor each. The hosts share this machine's loopback, so
each gets its own port range. Pass --config.<key> overrides as for any config file, and
projects/drq_v2/tiny.py's flags for tiny sizes.
"""

from magi_lp.cluster.config import hosts_defaults, machine
from projects.drq_v2.tasks import make_config

BASE_PORT = 23400
HOSTS = {"main": "127.0.0.2", "a1": "127.0.0.3", "a2": "127.0.0.4"}


def get_config():
    config = make_config("reacher_hard", distributed=True)
    config.num_actors = 2
    config.hosts = hosts_defaults()
    config.hosts.name = "tiny-drq"
    for offset, (name, address) in enumerate(HOSTS.items()):
        config.hosts.machines[name] = machine(address=address, base_port=BASE_PORT + 20 * offset)
    for group in ("replay", "counter", "learner", "evaluator", "coordinator"):
        config.hosts.place[group] = "main"
    config.hosts.place.actor = "a1,a2"
    # Quick fault detection and stop for a test; a cluster keeps the defaults.
    config.hosts.poll_seconds = 0.25
    config.hosts.heartbeat_timeout_seconds = 30.0
    config.hosts.stop_notice_seconds = 8.0
    return config
