"""What XLA on the CPU offers the DrQ-v2 update: each option timed in its own process.

    python -m benchmarks.cpu_learner_options [--updates N] [--batch B] [--image S]

Not a figure of BENCHMARKS.md: a comparison run by hand when choosing the learner's CPU
settings; its last run and what it decided are in benchmarks/README.md. Every option runs
the jitted update of `projects.drq_v2.learning.make_update_fn` at the paper's size on the
replay's batch (`FrameTransition`), in a fresh process (XLA flags are read once per
process), compile apart, on the same batch each call; it prints updates/s and CPU-seconds
per update.

Options:
  baseline      JAX's CPU defaults (XLA uses every core).
  one_thread    what a `cpu_threads: 1` group gets (`--xla_cpu_multi_thread_eigen=false`
                plus `intra_op_parallelism_threads=1`): one core's worth.
  donate        the state's buffers donated to the update (`donate_argnums=0`).
  fast_min_max  `--xla_cpu_enable_fast_min_max=true`.
  no_fast_math  `--xla_cpu_enable_fast_math=false` (explicitly; the default differs by version).
  ynn_dot       `--xla_cpu_experimental_ynn_fusion_type=dot`: XLA's dots through its YNNPACK
                library (jax 0.11: what the convolutions' weight gradients become).
  ynn_fusions   `--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce`.
The two YNNPACK options change the numbers a little (other summation orders): the parameters
after the same seeded updates differ from the baseline's (`learn_check/update_cost.py`'s
`params_sha256`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import REPO, cpu_only_env, random_frame_batch, timed_updates

OPTIONS = {
    "baseline": {"flags": "", "donate": False},
    "one_thread": {
        "flags": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
        "donate": False,
    },
    "donate": {"flags": "", "donate": True},
    "fast_min_max": {"flags": "--xla_cpu_enable_fast_min_max=true", "donate": False},
    "no_fast_math": {"flags": "--xla_cpu_enable_fast_math=false", "donate": False},
    "ynn_dot": {"flags": "--xla_cpu_experimental_ynn_fusion_type=dot", "donate": False},
    "ynn_fusions": {
        "flags": "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce",
        "donate": False,
    },
}


def worker(updates: int, batch_size: int, image: int, donate: bool) -> dict:
    import jax
    import numpy as np

    from projects.drq_v2.config import get_agent_config, replay_schedule
    from projects.drq_v2.learning import init_training_state, make_update_fn
    from projects.drq_v2.networks import make_networks

    class Spec:  # the action spec's fields make_networks reads
        shape, dtype, minimum, maximum = (2,), np.float32, -1.0, 1.0

    config = get_agent_config("reacher", "hard")
    config.batch_size = batch_size
    networks = make_networks(Spec(), config)
    obs = np.zeros((image, image, 9), np.uint8)
    state = init_training_state(networks, config, jax.random.PRNGKey(0), obs)
    update = make_update_fn(networks, config, replay_schedule(config, action_repeat=2))
    if donate:
        update = jax.jit(update.__wrapped__, donate_argnums=0)
    batch = random_frame_batch(batch_size, 3 + int(config.n_step), image, actions=2)
    timed = timed_updates(update, state, batch, updates)
    return {
        "updates_per_second": updates / timed.wall_s,
        "cpu_s_per_update": timed.cpu_s / updates,
        "first_call_s": timed.first_s,
        "critic_loss": float(timed.metrics["critic_loss"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--image", type=int, default=84)
    parser.add_argument("--only", default=",".join(OPTIONS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        option = OPTIONS[args.worker]
        print(json.dumps(worker(args.updates, args.batch, args.image, option["donate"])))
        return 0
    print(f"DrQ-v2 update, batch {args.batch}, {args.image}x{args.image}x9, {args.updates} updates")
    print(f"{'option':<14}{'updates/s':>10}{'CPU s/update':>14}{'first call s':>14}")
    for name in args.only.split(","):
        env = {**os.environ, **cpu_only_env()}
        env["XLA_FLAGS"] = OPTIONS[name]["flags"]
        env["PYTHONPATH"] = str(REPO)
        sizes = ["--updates", str(args.updates), "--batch", str(args.batch)]
        sizes += ["--image", str(args.image)]
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.cpu_learner_options", "--worker", name, *sizes],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            reason = (done.stderr.strip().splitlines() or ["no output"])[-1][:100]
            print(f"{name:<14}failed: {reason}")
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"{name:<14}{row['updates_per_second']:>10.3f}{row['cpu_s_per_update']:>14.2f}"
            f"{row['first_call_s']:>14.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
