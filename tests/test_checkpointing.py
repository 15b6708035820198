"""Checkpointer and PeriodicCheckpointer against real orbax files on disk (CPU only)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from magi_lp.errors import ConfigError
from magi_lp.runtime.checkpointing import Checkpointer, PeriodicCheckpointer, Snapshot
from tests import e2e_utils

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_state(seed: int = 0, width: int = 8):
    """A learner-like state: params, optax Adam state after one update, int counters."""
    rng = np.random.default_rng(seed)
    params = {
        "encoder": {"w": jnp.asarray(rng.normal(size=(4, width)), jnp.float32)},
        "critic": {"b": jnp.asarray(rng.normal(size=(width,)), jnp.float32)},
    }
    optimiser = optax.adam(1e-3)
    opt_state = optimiser.init(params)
    grads = jax.tree_util.tree_map(lambda p: p * 0.5 + 1.0, params)
    _, opt_state = optimiser.update(grads, opt_state, params)  # Non-zero mu, nu, count.
    return {
        "params": params,
        "opt_state": opt_state,
        "steps": jnp.asarray(1000 + seed, jnp.int32),
        "np_counter": np.int64(7 + seed),
        "py_counter": 3 + seed,
        "rng_key": jax.random.PRNGKey(seed),
    }


def assert_trees_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return e2e_utils.run_python(code, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=timeout)


def test_save_restore_round_trip_keeps_types_and_values(tmp_path):
    state = make_state(1)
    ckpt = Checkpointer(tmp_path / "ckpt")
    assert ckpt.latest_step() is None
    assert ckpt.save(5, state, {"actor_steps": 1234, "episodes": np.int64(9), "lr": 0.5})

    restored, metadata = Checkpointer(tmp_path / "ckpt").restore(make_state(99))

    assert_trees_equal(restored, state)
    assert isinstance(restored["opt_state"][0], optax.ScaleByAdamState)
    assert int(restored["opt_state"][0].count) == 1
    assert isinstance(restored["params"]["critic"]["b"], jax.Array)
    assert isinstance(restored["np_counter"], np.ndarray | np.generic)
    assert restored["py_counter"] == 4 and isinstance(restored["py_counter"], int)
    assert metadata == {"actor_steps": 1234, "episodes": 9, "lr": 0.5}


def test_restore_into_abstract_target_and_without_target(tmp_path):
    state = make_state(2)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, state)

    # eval_shape turns every leaf, Python and numpy counters too, into a jax array spec.
    abstract = jax.eval_shape(lambda: state)
    restored, metadata = ckpt.restore(abstract)
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(state)
    for got, want in zip(
        jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(state), strict=True
    ):
        assert isinstance(got, jax.Array)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert metadata == {}

    # No target: plain containers of numpy arrays (namedtuples become containers).
    raw, _ = ckpt.restore()
    assert all(isinstance(x, np.ndarray) for x in jax.tree_util.tree_leaves(raw))
    adam = raw["opt_state"][0]
    np.testing.assert_array_equal(
        adam["mu"]["encoder"]["w"], state["opt_state"][0].mu["encoder"]["w"]
    )
    assert int(raw["steps"]) == 1002


def test_latest_of_several_and_restore_a_given_step(tmp_path):
    ckpt = Checkpointer(tmp_path, max_to_keep=5)
    for step, seed in [(10, 10), (30, 30), (20, 20)]:  # 20 after 30: not newer, skipped.
        ckpt.save(step, make_state(seed), {"seed": seed})
    assert ckpt.all_steps() == [10, 30]
    assert ckpt.latest_step() == 30

    restored, metadata = ckpt.restore(make_state(0))
    assert metadata == {"seed": 30}
    assert_trees_equal(restored, make_state(30))

    older, metadata = ckpt.restore(make_state(0), step=10)
    assert metadata == {"seed": 10}
    assert_trees_equal(older, make_state(10))

    with pytest.raises(FileNotFoundError, match="step 20"):
        ckpt.restore(make_state(0), step=20)


def test_save_of_an_existing_step_keeps_the_state_and_updates_only_new_metadata(tmp_path):
    # A learner that took no step since its last save still saves the final counts.
    ckpt = Checkpointer(tmp_path)
    assert ckpt.save(3, make_state(3), {"v": 1})
    assert not ckpt.save(3, make_state(4), {"v": 1})  # nothing new
    assert ckpt.save(3, make_state(4), {"v": 2})  # new counts, same learner step
    assert not ckpt.save(2, make_state(2), {"v": 3})  # older steps are never written
    restored, metadata = ckpt.restore(make_state(0))
    assert metadata == {"v": 2}
    assert_trees_equal(restored, make_state(3))
    assert ckpt.all_steps() == [3]
    assert not [p for p in os.listdir(tmp_path / "3" / "metadata") if ".tmp" in p]


@pytest.mark.parametrize("damage", ["metadata", "state"])
def test_unreadable_newest_checkpoint_falls_back_to_the_one_before(tmp_path, capsys, damage):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, make_state(1), {"counts": {"actor_steps": 100}})
    ckpt.save(2, make_state(2), {"counts": {"actor_steps": 200}})
    if damage == "metadata":
        (tmp_path / "2" / "metadata" / "metadata").write_text('{"counts": {"actor_st')
    else:
        for path in (tmp_path / "2" / "state").rglob("*"):
            if path.is_file():
                path.write_bytes(b"\0garbage")
    step, state, metadata = ckpt.restore_newest_readable(make_state(0))
    assert step == 1 and metadata == {"counts": {"actor_steps": 100}}
    assert_trees_equal(state, make_state(1))
    lines = [line for line in capsys.readouterr().err.splitlines() if "cannot be read" in line]
    assert len(lines) == 1 and f"{tmp_path}/2 cannot be read" in lines[0], lines


def test_the_owner_sets_an_unreadable_checkpoint_aside_and_its_next_saves_are_written(tmp_path):
    """Left in place, the broken step 3 made every save of the resumed run at steps 2-3 a
    skip ("already saved"), or a metadata-only update of the broken one: a relaunch stopped
    before step 4 lost all its work, and the next relaunch restored step 1 again."""
    ckpt = Checkpointer(tmp_path)
    for step in (1, 3):
        ckpt.save(step, make_state(step), {"counts": {"actor_steps": 100 * step}})
    (tmp_path / "3" / "metadata" / "metadata").write_text('{"counts": {"actor_st')
    assert ckpt.restore_newest_readable(make_state(0))[0] == 1
    assert ckpt.all_steps() == [1, 3]  # a reader only: left where it is
    assert ckpt.restore_newest_readable(make_state(0), set_aside=True)[0] == 1
    assert ckpt.all_steps() == [1] and (tmp_path / "3.unreadable" / "metadata").is_dir()
    assert ckpt.save(2, make_state(2), {"counts": {"actor_steps": 200}})
    assert ckpt.save(3, make_state(3), {"counts": {"actor_steps": 300}})
    step, state, _ = Checkpointer(tmp_path).restore_newest_readable(make_state(0))
    assert step == 3
    assert_trees_equal(state, make_state(3))


def test_no_readable_checkpoint_gives_none_only_when_there_is_none(tmp_path):
    assert Checkpointer(tmp_path).restore_newest_readable(make_state(0)) is None


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_full_disk_is_one_line_naming_the_folder_and_leaves_no_tmp_folder(tmp_path):
    # A real full file system: a 400 KiB tmpfs mounted in a private user+mount namespace.
    mount = tmp_path / "small_disk"
    mount.mkdir()
    code = f"""
        import os, numpy as np
        from magi_lp.runtime.checkpointing import Checkpointer, CheckpointWriteError
        ckpt = Checkpointer({str(mount / "ckpt")!r})
        ckpt.save(1, {{"w": np.zeros(1000, np.float32)}})
        try:
            ckpt.save(2, {{"w": np.random.rand(1_000_000).astype(np.float32)}})
        except CheckpointWriteError as error:
            print("ERROR", error)
        print("LEFT", sorted(os.listdir({str(mount / "ckpt")!r})))
    """
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
    probe = subprocess.run(["unshare", "-Urm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user+mount namespaces here: {probe.stderr.decode().strip()}")
    result = subprocess.run(
        [
            "unshare",
            "-Urm",
            "sh",
            "-c",
            'mount -t tmpfs -o size=400k tmpfs "$1" && exec "$2" -c "$3"',
            "sh",
            str(mount),
            sys.executable,
            textwrap.dedent(code),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    error = next(line for line in result.stdout.splitlines() if line.startswith("ERROR"))
    assert "no space left on device (ENOSPC)" in error and str(mount / "ckpt") in error
    assert "resumes from checkpoint 1" in error and len(error) < 400, error
    assert "LEFT ['1']" in result.stdout, result.stdout


def test_max_to_keep_deletes_older_steps(tmp_path):
    ckpt = Checkpointer(tmp_path, max_to_keep=2)
    for step in range(1, 6):
        ckpt.save(step * 100, make_state(step))
    assert ckpt.all_steps() == [400, 500]
    assert sorted(p for p in os.listdir(tmp_path) if not p.startswith(".")) == ["400", "500"]
    with pytest.raises(ConfigError, match="max_to_keep"):
        Checkpointer(tmp_path / "other", max_to_keep=0)


def test_restore_with_no_checkpoint_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no finished checkpoint"):
        Checkpointer(tmp_path).restore()


def test_mismatched_target_is_refused_by_name(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, make_state(0, width=8))
    # Orbax alone would silently pad/truncate into the wider arrays.
    with pytest.raises(
        ConfigError,
        match=r"state: 6 differences: .*'opt_state\.0\.mu\.encoder\.w' has shape \(4, 8\)",
    ):
        ckpt.restore(make_state(0, width=16))
    extra = make_state(0)
    extra["target_params"] = extra["params"]
    with pytest.raises(ConfigError, match=r"'target_params\.critic\.b' is not in the checkpoint"):
        ckpt.restore(extra)


def test_metadata_must_be_json(tmp_path):
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(TypeError, match="JSON"):
        ckpt.save(1, make_state(), {"bad": object()})
    assert ckpt.latest_step() is None


@pytest.mark.integration  # a Python process of its own that imports a framework
def test_save_in_one_process_restore_in_another(tmp_path):
    directory = str(tmp_path / "ckpt")
    saver = run_python(
        f"""
        from tests.test_checkpointing import make_state
        from magi_lp.runtime.checkpointing import Checkpointer
        ckpt = Checkpointer({directory!r})
        ckpt.save(7, make_state(7), {{"actor_steps": 70}})
        ckpt.save(8, make_state(8), {{"actor_steps": 80}})
        """
    )
    assert saver.returncode == 0, saver.stderr[-3000:]

    restorer = run_python(
        f"""
        import json
        import jax, numpy as np
        from tests.test_checkpointing import make_state
        from magi_lp.runtime.checkpointing import Checkpointer
        ckpt = Checkpointer({directory!r})
        state, metadata = ckpt.restore(make_state(0))
        leaves = [np.asarray(x).tolist() for x in jax.tree_util.tree_leaves(state)]
        print("RESULT" + json.dumps({{"step": ckpt.latest_step(), "meta": metadata,
                                     "leaves": leaves}}))
        """
    )
    assert restorer.returncode == 0, restorer.stderr[-3000:]
    line = next(x for x in restorer.stdout.splitlines() if x.startswith("RESULT"))
    result = json.loads(line[len("RESULT") :])
    assert result["step"] == 8
    assert result["meta"] == {"actor_steps": 80}
    expected = [np.asarray(x).tolist() for x in jax.tree_util.tree_leaves(make_state(8))]
    assert result["leaves"] == expected


def test_leftover_tmp_dir_is_ignored_then_cleaned(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(10, make_state(10), {"seed": 10})
    # What a save killed before its rename leaves: a tmp-named folder, partly written.
    leftover = tmp_path / "20.orbax-checkpoint-tmp-1234"
    shutil.copytree(tmp_path / "10", leftover)
    (leftover / "metadata" / "metadata").write_text('{"seed": 2')  # Truncated JSON.

    fresh = Checkpointer(tmp_path)
    assert fresh.latest_step() == 10
    _, metadata = fresh.restore(make_state(0))
    assert metadata == {"seed": 10}
    assert leftover.exists()  # Readers leave it alone.

    assert fresh.save(20, make_state(20), {"seed": 20})
    assert not leftover.exists()  # The writer cleans up before its first save.
    assert fresh.latest_step() == 20
    assert fresh.restore(make_state(0))[1] == {"seed": 20}


@pytest.mark.integration  # a Python process of its own that imports a framework
def test_process_killed_mid_save_leaves_nothing_restorable(tmp_path):
    """SIGKILL a real saver after its data is written but before orbax's rename."""
    directory = str(tmp_path / "ckpt")
    marker = tmp_path / "in_finalize"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import pathlib, time
                from orbax.checkpoint.path import atomicity
                from tests.test_checkpointing import make_state
                from magi_lp.runtime.checkpointing import Checkpointer

                ckpt = Checkpointer({directory!r})
                ckpt.save(1, make_state(1), {{"seed": 1}})

                def hang(self):
                    pathlib.Path({str(marker)!r}).touch()
                    time.sleep(600)

                atomicity.AtomicRenameTemporaryPath.finalize = hang
                ckpt.save(2, make_state(2), {{"seed": 2}})
                """
            ),
        ],
        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "saver never reached the rename"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stderr.close()

    names = os.listdir(directory)
    # orbax 0.6 names it `2.orbax-checkpoint-tmp-<n>`, 0.12 `2.orbax-checkpoint-tmp`.
    assert any(n.startswith("2.orbax-checkpoint-tmp") for n in names), names
    assert "2" not in names
    ckpt = Checkpointer(directory)
    assert ckpt.latest_step() == 1
    restored, metadata = ckpt.restore(make_state(0))
    assert metadata == {"seed": 1}
    assert_trees_equal(restored, make_state(1))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_arriving_mid_save_waits_for_the_save(tmp_path, monkeypatch, capsys, signum):
    """Ctrl-C (or the learn check's SIGTERM, which raises KeyboardInterrupt) while orbax
    writes: the save is not cut, its step is in place, and the stop comes after it. Cut, it
    left orbax's writer threads filling the tmp folder that the save at stop then needed (a
    learn-check run, 2026-11-28: "Directory not empty", its final checkpoint lost). The
    signal is sent right before the rename, where it lands with certainty."""
    from orbax.checkpoint.path import atomicity

    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signum, stop)
    finalize = atomicity.AtomicRenameTemporaryPath.finalize
    armed, sent = [False], []

    def finalize_after_a_signal(self, *args, **kwargs):
        if armed[0] and not sent:
            sent.append(signum)
            os.kill(os.getpid(), signum)
            sum(range(1000))  # bytecode: an undeferred handler would raise here
        return finalize(self, *args, **kwargs)

    monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", finalize_after_a_signal)
    ckpt = Checkpointer(tmp_path)
    try:
        ckpt.save(1, make_state(1), {"seed": 1})
        armed[0] = True
        with pytest.raises(KeyboardInterrupt):
            ckpt.save(2, make_state(2), {"seed": 2})
            sum(range(1000))  # where a signal sent from orbax's own thread arrives
    finally:
        signal.signal(signum, previous)
    assert sent == [signum]
    assert sorted(os.listdir(tmp_path)) == ["1", "2"]  # in place, no tmp folder
    assert "stopping once checkpoint 2 is written" in capsys.readouterr().err
    # The save at stop, at the same step: nothing to write, no error.
    assert not ckpt.save(2, make_state(2), {"seed": 2})
    restored, metadata = Checkpointer(tmp_path).restore(make_state(0))
    assert metadata == {"seed": 2}
    assert_trees_equal(restored, make_state(2))


def test_periodic_checkpointer_saves_when_due_and_at_stop(tmp_path):
    now = [0.0]
    calls = []
    learner_step = [0]

    def get_state():
        calls.append(learner_step[0])
        return Snapshot(learner_step[0], make_state(learner_step[0]), {"at": learner_step[0]})

    ckpt = Checkpointer(tmp_path)
    periodic = PeriodicCheckpointer(
        ckpt, every_minutes=5, get_state=get_state, clock=lambda: now[0]
    )

    learner_step[0] = 10
    now[0] = 299.0
    assert not periodic.maybe_save()
    assert calls == []  # Not due: the state is not even read.

    now[0] = 300.0
    assert periodic.maybe_save()
    assert ckpt.latest_step() == 10 and periodic.last_saved_step == 10

    learner_step[0] = 20
    now[0] = 500.0
    assert not periodic.maybe_save()  # 200 s since the last save.
    now[0] = 600.0
    assert periodic.maybe_save()
    assert ckpt.all_steps() == [10, 20]

    learner_step[0] = 25
    now[0] = 601.0
    assert periodic.save_now()  # At stop, whatever the clock says.
    assert not periodic.save_now()  # Same step again: nothing new to write.
    assert ckpt.latest_step() == 25
    assert ckpt.restore(make_state(0))[1] == {"at": 25}
    assert calls == [10, 20, 25, 25]

    # A plain tuple works as well as a Snapshot.
    tuple_periodic = PeriodicCheckpointer(ckpt, 1, lambda: (30, make_state(30)))
    assert tuple_periodic.save_now()
    assert ckpt.restore(make_state(0))[1] == {}


@pytest.mark.parametrize("minutes", [0, -1])
def test_periodic_checkpointer_refuses_a_bad_period(tmp_path, minutes):
    with pytest.raises(ConfigError, match=r"checkpoint\.every_minutes"):
        PeriodicCheckpointer(Checkpointer(tmp_path), minutes, lambda: (0, {}))


def test_save_and_restore_time_for_5mb_state(tmp_path, capsys):
    params = {"w": jnp.ones((416, 1024), jnp.float32), "b": jnp.zeros((1024,), jnp.float32)}
    state = {"params": params, "opt_state": optax.adam(1e-3).init(params), "steps": 0}
    nbytes = sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(state))
    assert 4.5e6 < nbytes < 6e6

    ckpt = Checkpointer(tmp_path)
    save_s, restore_s = [], []
    for step in range(1, 6):
        start = time.perf_counter()
        ckpt.save(step, state)
        save_s.append(time.perf_counter() - start)
    for _ in range(3):
        start = time.perf_counter()
        restored, _ = ckpt.restore(state)
        jax.block_until_ready(restored)
        restore_s.append(time.perf_counter() - start)
    assert_trees_equal(restored, state)
    with capsys.disabled():
        print(
            f"\n[orbax {nbytes / 1e6:.1f} MB] save median {1e3 * np.median(save_s):.0f} ms "
            f"(first {1e3 * save_s[0]:.0f} ms), restore median {1e3 * np.median(restore_s):.0f} ms"
        )
    # Generous bound for a loaded 2-core box; measured ~30 ms / ~20 ms.
    assert np.median(save_s) < 5.0 and np.median(restore_s) < 5.0


def test_a_runs_identity_is_its_agent_and_env_sections_and_differences_name_their_keys():
    """What a relaunch must give as its checkpoint was saved with (cli refuses otherwise)."""
    import ml_collections

    from magi_lp.runtime.checkpoint_metadata import identity_differences, run_identity

    config = ml_collections.ConfigDict(
        {"agent": {"hidden_sizes": (32, 32), "lr": 1e-3}, "env": {"task": "balance"},
         "max_actor_steps": 100}
    )  # fmt: skip
    saved = run_identity(config)
    assert saved == {"agent": {"hidden_sizes": [32, 32], "lr": 1e-3}, "env": {"task": "balance"}}
    assert identity_differences(saved, run_identity(config)) == []
    config.max_actor_steps = 200  # not the run's identity: a limit may change
    config.agent.hidden_sizes = (16, 16)
    config.env.task = "swingup"
    assert identity_differences(saved, run_identity(config)) == [
        ("agent.hidden_sizes", [32, 32], [16, 16]),
        ("env.task", "balance", "swingup"),
    ]
    # A key on one side only (a setting another version of the project added or removed),
    # what changes speed or records, not learning, and a checkpoint from before identities.
    assert identity_differences({"env": {}}, {"env": {"task": "a"}}) == []
    before = {"agent": {"dataset_num_parallel_calls": 2}, "env": {"video": {"fps": 25}}}
    after = {"agent": {"dataset_num_parallel_calls": 4}, "env": {"video": {"fps": 10}}}
    assert identity_differences(before, after) == []
    assert identity_differences(None, run_identity(config)) == []
