"""Why a run did not learn: is its actor's mean action saturated? Both agents, the same
observations.

    .venv312/bin/python -m benchmarks.learn_check.saturation [--out runs/learn_check]
        [--task cartpole_balance] [--seeds 1 2 3] [--image-size 48]

DrQ-v2's actor ends in tanh, and its update (the deterministic policy gradient through the
critic) reaches the weights only through tanh's slope: once the pre-tanh output is large for
every observation, the gradient is about zero and the actor can stay at +-1 for good. On
cartpole_balance a policy pinned at one end drives the cart to the wall and the pole falls at
once: about 136 per episode, the plateau the learn check's runs show.

This measures it. It renders `--observations` frame stacks of the task at the runs' image
size with this project's environment (seed 0, uniform random actions, every 5th agent step
of one episode), the same stacks for every run; then, for each run folder under `--out`
(finished or not), takes its newest state (ours: the learner's newest checkpoint; the
official agent: its `snapshot.pt`, read by `.venv-official`'s python and the run's copy of the
official code) and reports, over those observations: `pinned` (every mean action at the
same end, |a| > 0.99 with one sign: the collapse), the fraction whose mean action has
|a| > 0.99 (`saturated`; a learned bang-bang controller is saturated too, at both ends, so
this alone is not a collapse), the mean action's mean and its spread (standard deviation)
across observations, the frames the state was trained to, and why an actor stays where it
is (`_summary`: how far past tanh's slope its pre-tanh output is, and the share of
observations whose critic asks for an action further toward that end). Writes `SATURATION`
(`benchmarks/learn_check/results/saturation.json`, committed; figure 13 shows it) and prints
a table; `--write PATH` writes elsewhere. Light: a few CPU seconds a run (one thread),
beside the runs.

Each row names the run it probed (`run_started`: its first launch's start, epoch seconds)
and when (`measured_at`). A seed's run lost with its machine and started again is another
run: the file keeps the earlier run's rows beside the new run's (`merge`), and the figures
tell them apart (`same_run`). Rows written before rows named their run (up to 04cd535) are
told by time: a probe measured before a run's first launch is of an earlier run.

The official agent's side runs as a script in its own venv (`--official-probe`): nothing of
magi_lp is imported there.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SATURATED = 0.99
"""|mean action| above this counts as saturated (tanh's slope there is < 0.02)."""
EVERY_STEPS = 5
SATURATION = Path(__file__).resolve().parent / "results" / "saturation.json"
"""The probe of the kept runs, read by the figure (comparison.report)."""


def run_started(folder: Path) -> float | None:
    """When the run in `folder` was first launched (epoch seconds), from its attempts.jsonl."""
    from benchmarks.learn_check.runs import read_attempts

    attempts = read_attempts(folder)
    return float(attempts[0]["started"]) if attempts else None


def _epoch(stamp: str) -> float:
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp()


def utc_text(stamp: str) -> str:
    """A `measured_at` (ISO, with its UTC offset) as 2026-11-29 17:02 UTC."""
    moment = datetime.datetime.fromtimestamp(_epoch(stamp), datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def same_run(row: dict, started: float | None, measured_at: str) -> bool:
    """Whether probe `row` is of the run first launched at `started` (epoch seconds). Rows
    name their run; an older row, only when it was measured (`measured_at`, the file's when
    the row has none): at or after the start, it can only be of this run. A row with
    neither is taken as of this run."""
    if started is None:
        return False
    if row.get("run_started") is not None:
        return abs(float(row["run_started"]) - started) < 1.0
    measured = row.get("measured_at") or measured_at
    return not measured or _epoch(measured) >= started  # no time at all: nothing tells


def merge(new: list[dict], earlier: dict | None) -> list[dict]:
    """This probe's rows, and the earlier file's rows of runs not probed now (other seeds,
    or a seed's earlier run, lost with its machine): each keeps when it was measured."""
    if not earlier:
        return new
    kept = []
    for row in earlier.get("runs", []):
        row = {
            "measured_at": earlier.get("measured_at"),
            "commit": earlier.get("commit"),
            "machine": earlier.get("machine"),
            **row,
        }
        again = any(
            n["agent"] == row["agent"]
            and n["seed"] == row["seed"]
            # A new row that names no run (its folder has no launches file) replaces all.
            and (n.get("run_started") is None
                 or same_run(row, n.get("run_started"), row["measured_at"]))
            for n in new
        )  # fmt: skip
        if not again:
            kept.append(row)
    return sorted(new + kept, key=lambda r: (r["seed"], r["agent"], r.get("run_started") or 0))


def _summary(means: list[float], pre_tanh: list[float], slopes: list[float]) -> dict:
    """The probe's numbers of one actor: its mean actions, and why they stay where they are:
    `pre_tanh` (the median |x| of tanh(x), the mean action: past about 5 its slope is under
    1e-4, and no update moves it back) and `critic_pushes_out` (the share of observations
    whose critic, min(Q1, Q2), rises toward the end the mean action is at: dQ/da of that
    sign; the deterministic policy gradient then drives the actor further out)."""
    import numpy as np

    values = np.asarray(means, np.float64).ravel()
    pinned = bool(np.all(values > SATURATED) or np.all(values < -SATURATED))
    slope = np.asarray(slopes, np.float64).ravel()
    return {
        "pinned": pinned,
        "saturated": float(np.mean(np.abs(values) > SATURATED)),
        "mean_action": float(values.mean()),
        "action_spread": float(values.std()),
        "observations": int(values.size),
        "pre_tanh": float(np.median(np.abs(np.asarray(pre_tanh, np.float64)))),
        "critic_pushes_out": float(np.mean(slope * np.sign(values) > 0)),
    }


def official_probe(observations: str, snapshot: str, code: str) -> dict:
    """The official agent's mean action on `observations` ([N, H, W, 9] uint8, as ours
    stacks them: oldest frame first, so [N, 9, H, W] is the official layout)."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, code)
    payload = torch.load(snapshot, map_location="cpu", weights_only=False)
    agent = payload["agent"]
    obs = np.ascontiguousarray(np.load(observations)["obs"].transpose(0, 3, 1, 2))
    obs = torch.as_tensor(obs).float()
    with torch.no_grad():
        features = agent.encoder(obs)
        raw = agent.actor.policy(agent.actor.trunk(features))  # Actor.forward before its tanh
    mean = torch.tanh(raw).requires_grad_(True)
    q1, q2 = agent.critic(features, mean)
    torch.min(q1, q2).sum().backward()
    frames = int(payload.get("_global_step", 0)) * 2  # action repeat 2
    summary = _summary(mean.detach().numpy().tolist(), raw.numpy().tolist(), mean.grad.tolist())
    return {**summary, "frames": frames}


def render_observations(task: str, image_size: int, count: int) -> object:
    """`count` frame stacks of `task` ([N, H, W, 9] uint8): seed 0, uniform random actions,
    every `EVERY_STEPS`th agent step, episodes restarted as needed. Headless: EGL unless
    MUJOCO_GL says otherwise (read when dm_control is first imported)."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    import numpy as np

    from projects.drq_v2.config import default_camera_id
    from projects.drq_v2.environment import make_environment
    from projects.drq_v2.tasks import PAPER_TASKS

    domain, name = PAPER_TASKS[task]
    env = make_environment(
        domain,
        name,
        seed=0,
        image_size=image_size,
        action_repeat=2,
        frame_stack=3,
        camera_id=default_camera_id(domain),
    )
    spec = env.action_spec()
    rng = np.random.default_rng(0)
    found = []
    step = env.reset()
    t = 0
    while len(found) < count:
        if step.last():
            step = env.reset()
        if t % EVERY_STEPS == 0:
            found.append(step.observation)
        step = env.step(rng.uniform(spec.minimum, spec.maximum, spec.shape).astype(np.float32))
        t += 1
    return np.stack(found)


def ours_probe(observations: object, checkpoints: Path) -> dict | None:
    """Our learner's newest checkpoint: the actor's mean action on `observations`; None
    before the run's first checkpoint."""
    import haiku as hk
    import jax
    import numpy as np
    from dm_env import specs

    from magi_lp.runtime.checkpointing import Checkpointer
    from projects.drq_v2.config import get_agent_config
    from projects.drq_v2.networks import _mlp, _trunk, make_networks

    checkpointer = Checkpointer(checkpoints)
    if checkpointer.latest_step() is None:
        return None
    state, metadata = checkpointer.restore()
    params = state["params"]
    config = get_agent_config("cartpole", "balance")
    action_dim = params["actor"]["policy/~/linear_2"]["b"].shape[0]
    networks = make_networks(specs.BoundedArray((action_dim,), np.float32, -1.0, 1.0), config)
    obs = jax.numpy.asarray(observations)
    features = networks.encoder_apply(params["encoder"], obs)
    # The actor before its tanh: the modules (and names) of networks.actor_fn, less the tanh.
    before_tanh = hk.without_apply_rng(
        hk.transform(
            lambda f: _mlp(config.hidden_dim, action_dim, name="policy")(
                _trunk(f, config.feature_dim)
            )
        )
    )
    raw = before_tanh.apply(params["actor"], features)
    mean = networks.actor_apply(params["actor"], features)

    def critic(action: jax.Array) -> jax.Array:
        q1, q2 = networks.critic_apply(params["critic"], features, action)
        return jax.numpy.minimum(q1, q2).sum()

    slopes = jax.grad(critic)(mean)
    actor_steps = int((metadata.get("counts") or {}).get("actor_steps", 0))
    summary = _summary(np.asarray(mean).tolist(), np.asarray(raw).tolist(), slopes.tolist())
    return {**summary, "frames": 2 * actor_steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official-probe", nargs=3, metavar=("OBS", "SNAPSHOT", "CODE"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--task", default=None, help="default: the check's first task")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: SEEDS")
    parser.add_argument("--image-size", type=int, default=None, help="default: the check's")
    parser.add_argument("--observations", type=int, default=100)
    parser.add_argument("--write", type=Path, default=SATURATION)
    args = parser.parse_args(argv)
    if args.official_probe:
        print(json.dumps(official_probe(*args.official_probe)))
        return 0

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpy as np

    from benchmarks import common
    from benchmarks.learn_check.runs import VENV_OFFICIAL
    from benchmarks.learn_check.settings import DEFAULT_TASKS, FULL, OUT, SEEDS, run_dir

    out = args.out or OUT
    args.task = args.task or DEFAULT_TASKS[0]
    args.seeds = args.seeds or list(SEEDS)
    args.image_size = args.image_size or FULL.image_size
    obs = render_observations(args.task, args.image_size, args.observations)
    found = []
    measured_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    commit = common.git_commit()

    def named(folder: Path) -> dict:
        return {"run_started": run_started(folder), "measured_at": measured_at, "commit": commit}

    with tempfile.TemporaryDirectory(prefix="magi_lp_saturation_") as scratch:
        obs_file = Path(scratch) / "obs.npz"
        np.savez(obs_file, obs=obs)
        for seed in args.seeds:
            folder = run_dir(out, "magi_lp", args.task, seed)
            ours = folder / "work" / "checkpoints" / "learner"
            probe = ours_probe(obs, ours) if ours.is_dir() else None
            if probe is not None:
                found.append({"agent": "magi_lp", "seed": seed, **probe, **named(folder)})
            folder = run_dir(out, "official", args.task, seed)
            snapshot = folder / "work" / "snapshot.pt"
            if snapshot.is_file():
                python = VENV_OFFICIAL / "bin" / "python"
                paths = (obs_file, snapshot, folder / "code")
                done = subprocess.run(
                    [str(python), __file__, "--official-probe", *map(str, paths)],
                    capture_output=True,
                    text=True,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                    check=False,
                )
                if done.returncode != 0:
                    tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
                    print(f"saturation: official seed {seed}: {tail[0]}", file=sys.stderr)
                    continue
                probe = json.loads(done.stdout.splitlines()[-1])
                found.append({"agent": "official", "seed": seed, **probe, **named(folder)})
    earlier = json.loads(args.write.read_text()) if args.write.is_file() else None
    same_probe = earlier and all(
        earlier.get(key) == value
        for key, value in (("task", args.task), ("image_size", args.image_size),
                           ("observations", args.observations))
    )  # fmt: skip
    result = {
        "task": args.task,
        "image_size": args.image_size,
        "observations": args.observations,
        "saturated_above": SATURATED,
        "measured_at": measured_at,
        "commit": commit,
        "machine": common.machine(),
        "runs": merge(found, earlier if same_probe else None),
    }
    args.write.parent.mkdir(parents=True, exist_ok=True)
    args.write.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join([*table(found), "", *why_table(found)]))
    return 0


def _markdown(runs: list[dict], columns: list[str], cells: Any) -> list[str]:
    """`runs` as a Markdown table: agent, seed, the run each row is of where the figure said
    it (`run`), frames, then `columns`, each row's from `cells(run)`."""
    named = any("run" in run for run in runs)
    head = ["agent", "seed", *(["run"] if named else []), "frames", *columns]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for run in runs:
        first = [str(run["agent"]), str(run["seed"]), *([run.get("run", "")] if named else [])]
        lines.append("| " + " | ".join([*first, f"{run['frames']:,}", *cells(run)]) + " |")
    return lines


def table(runs: list[dict]) -> list[str]:
    """The probe's runs as a Markdown table (printed here, and in figures 13 and 17)."""
    return _markdown(
        runs,
        ["pinned", "share saturated", "mean action", "spread"],
        lambda run: [
            "**yes**" if run["pinned"] else "no",
            f"{run['saturated']:.2f}",
            f"{run['mean_action']:+.3f}",
            f"{run['action_spread']:.3f}",
        ],
    )


def why_table(runs: list[dict]) -> list[str]:
    """Why each probed actor stays where it is (`_summary`), for the rows that were probed
    for it (rows before 2026-12-01 were not): a Markdown table, or nothing."""
    rows = [run for run in runs if "pre_tanh" in run]
    if not rows:
        return []
    return _markdown(
        rows,
        ["mean action", "median pre-tanh abs(x)", "critic pushes out"],
        lambda run: [
            f"{run['mean_action']:+.3f}",
            f"{run['pre_tanh']:.2f}",
            f"{run['critic_pushes_out']:.2f}",
        ],
    )


if __name__ == "__main__":
    sys.exit(main())
