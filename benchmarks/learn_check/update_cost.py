"""CPU seconds per update of either agent at a candidate image size and batch, for choosing
the learn check's settings (candidates.md): a training frame costs half an update (one update
every 2 agent steps, action repeat 2) plus its acting, and the update is most of it on a CPU.

    .venv312/bin/python -m benchmarks.learn_check.update_cost --agent magi_lp --image-size 32 \\
        --batch-size 256 [--updates 20]
    .venv-official/bin/python benchmarks/learn_check/update_cost.py --agent official \\
        --official ../drqv2 --image-size 32 --batch-size 256

Random batches of the agent's own layout (ours: the replay's frame window through the jitted
update, as benchmarks/learner_updates.py builds it; the official: its `DrQV2Agent.update` on
an iterator of CPU tensors, one torch thread, so without its replay worker's sampling). CPU
seconds are the process's (user + system): what a loaded machine inflates least. Prints one
JSON line, with `params_sha256`: a digest of the parameters after the updates (seeded), so two
environments (an allocator's settings, say) can be shown to compute the same numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _digest(arrays) -> str:
    """sha256 over the arrays' bytes, in the given order."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(array.tobytes())
    return digest.hexdigest()


def ours(image_size: int, batch_size: int, updates: int) -> dict:
    """The jitted update of projects/drq_v2/learning.py on the replay's frame window, as
    benchmarks/learner_updates.py builds it (its acme import is not in .venv312)."""
    import jax
    import numpy as np
    from dm_env import specs

    from benchmarks.common import random_frame_batch, timed_updates
    from projects.drq_v2 import learning
    from projects.drq_v2.config import get_agent_config, replay_schedule
    from projects.drq_v2.networks import make_networks

    config = get_agent_config("cartpole", "balance")
    config.batch_size = batch_size
    action_spec = specs.BoundedArray((1,), np.float32, -1.0, 1.0)  # cartpole: 1 action
    networks = make_networks(action_spec, config)
    obs_example = np.zeros((image_size, image_size, 9), np.uint8)
    state = learning.init_training_state(networks, config, jax.random.PRNGKey(0), obs_example)
    update = learning.make_update_fn(networks, config, replay_schedule(config, action_repeat=2))
    batch = random_frame_batch(batch_size, 6, image_size, actions=1)
    state, metrics, first, wall, cpu = timed_updates(update, state, batch, updates)
    assert np.isfinite(float(metrics["critic_loss"]))
    return {
        "params_sha256": _digest(np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(state)),
        "cpu_seconds_per_update": cpu / updates,
        "wall_seconds_per_update": wall / updates,
        "first_call_s": first,
        "updates": updates,
        "jax": jax.__version__,
    }


def official(checkout: Path, image_size: int, batch_size: int, updates: int) -> dict:
    # torch makes its inductor cache at the optimizer's first step, in /tmp unless told:
    # a folder of its own, removed at the end, so nothing is left behind.
    with tempfile.TemporaryDirectory(prefix="magi_lp_update_cost_inductor_") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        return _official(checkout, image_size, batch_size, updates)


def _official(checkout: Path, image_size: int, batch_size: int, updates: int) -> dict:
    import torch

    # official.py by its path: the package's __init__ needs this project's stack, which
    # .venv-official does not hold (official.py itself is the standard library only).
    spec = importlib.util.spec_from_file_location(
        "official", Path(__file__).with_name("official.py")
    )
    code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code)
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the networks' initialisation and the augmentation's shifts
    # The patched copy lives only while it is imported: nothing is left in /tmp.
    with tempfile.TemporaryDirectory(prefix="magi_lp_update_cost_") as scratch:
        folder = code.prepare(checkout, Path(scratch) / "code")
        sys.path.insert(0, str(folder))
        try:
            import drqv2  # the patched copy (it imports its siblings at once)
        finally:
            sys.path.remove(str(folder))

    agent = drqv2.DrQV2Agent(
        obs_shape=(9, image_size, image_size),
        action_shape=(1,),
        device="cpu",
        lr=1e-4,
        feature_dim=50,
        hidden_dim=1024,
        critic_target_tau=0.01,
        num_expl_steps=2000,
        update_every_steps=2,
        stddev_schedule="linear(1.0,0.1,100000)",
        stddev_clip=0.3,
        use_tb=False,
    )  # fmt: skip  (cfgs/config.yaml and task/easy.yaml's values; cartpole: 1 action)
    generator = torch.Generator().manual_seed(0)

    def batches():
        while True:
            obs = torch.randint(0, 256, (batch_size, 9, image_size, image_size),
                                generator=generator, dtype=torch.uint8)  # fmt: skip
            yield (obs, torch.rand(batch_size, 1) * 2 - 1, torch.rand(batch_size, 1),
                   torch.full((batch_size, 1), 0.99**3), obs.clone())  # fmt: skip

    iterator = batches()
    start, start_cpu = time.perf_counter(), _cpu()
    agent.update(iterator, 2)  # the first: warms the allocator
    first = time.perf_counter() - start
    start, start_cpu = time.perf_counter(), _cpu()
    for step in range(updates):
        agent.update(iterator, 2 * (step + 2))
    wall, cpu = time.perf_counter() - start, _cpu() - start_cpu
    modules = (agent.encoder, agent.actor, agent.critic, agent.critic_target)
    return {
        "params_sha256": _digest(
            tensor.detach().numpy()
            for module in modules
            for _, tensor in sorted(module.state_dict().items())
        ),
        "cpu_seconds_per_update": cpu / updates,
        "wall_seconds_per_update": wall / updates,
        "first_call_s": first,
        "updates": updates,
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", choices=("magi_lp", "official"), required=True)
    parser.add_argument("--official", default="../drqv2")
    parser.add_argument("--image-size", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--updates", type=int, default=20)
    args = parser.parse_args(argv)
    if args.agent == "magi_lp":
        found = ours(args.image_size, args.batch_size, args.updates)
    else:
        found = official(Path(args.official), args.image_size, args.batch_size, args.updates)
    line = {"agent": args.agent, "image_size": args.image_size, "batch_size": args.batch_size}
    print(json.dumps({**line, **found}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
