"""Where a run's Ray files go (magi_lp/engines/ray_paths.py): within Linux's socket-path limit
under any TMPDIR, or one refusal naming it; and the SLURM job's script applies the same rule."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from magi_lp.engines import ray_paths
from magi_lp.errors import ConfigError
from magi_lp.launch import run_folders


def test_a_runs_ray_folder_keeps_every_socket_path_within_linuxs_limit(tmp_path, monkeypatch):
    short, fallback = tmp_path / "t", tmp_path / "r"
    long = tmp_path / ("scratch" * 6)  # a TMPDIR like a cluster job's scratch folder
    for folder in (short, fallback, long):
        folder.mkdir()
    # The limit as if the temp folder were /tmp: a folder as long as `short` just fits.
    limit = len(str(short / "magi_lp_ray_12345678" / ray_paths.LONGEST_SOCKET))
    monkeypatch.setattr(ray_paths, "SOCKET_PATH_LIMIT", limit)
    monkeypatch.setattr(ray_paths, "RAY_FALLBACK_ROOT", str(fallback))

    def made_under(temp: Path) -> Path:
        monkeypatch.setattr(tempfile, "tempdir", str(temp))
        made = Path(ray_paths.run_temp_folder())
        assert made.is_dir() and made.name.startswith("magi_lp_ray_")
        assert len(str(made / ray_paths.LONGEST_SOCKET)) <= limit
        # Marked as this process's: a sweep removes it once this process is gone.
        assert (made / run_folders.OWNER_FILE).read_text() == str(os.getpid())
        return made.parent

    assert made_under(short) == short
    assert made_under(long) == fallback  # where Ray's own default root would be
    monkeypatch.setattr(ray_paths, "RAY_FALLBACK_ROOT", str(long))
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    room = limit - len("magi_lp_ray_12345678/" + ray_paths.LONGEST_SOCKET) - 1
    with pytest.raises(
        ConfigError, match=rf"^TMPDIR {long}: Ray's .*; set TMPDIR .* of at most {room} characters"
    ):
        ray_paths.run_temp_folder()
    assert sorted(p.name for p in long.iterdir()) == []  # nothing made where it was refused


@pytest.mark.parametrize(
    ("tmpdir", "root"),
    [("", "/tmp"), ("/tmp/slurm_1", "/tmp/slurm_1"), ("/local/scratch/job_1234567", "/tmp")],
)
def test_the_slurm_jobs_ray_folders_follow_the_same_rule(tmpdir, root):
    from magi_lp.cluster.ray_slurm import RAY_FOLDER

    # The generator's script (tests/test_ray_slurm.py checks the golden file is what it writes).
    golden = Path(__file__).resolve().parent / "golden" / "cluster" / "ray-slurm"
    script = (golden / "drq-reacher.sbatch").read_text()
    lines = script.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith('RAY_ROOT="'))
    rule = "\n".join(lines[first : first + 3])  # RAY_ROOT, its check, RAY_TMP
    env = {"TMPDIR": tmpdir, "SLURM_JOB_ID": "9999999999"} if tmpdir else {}
    done = subprocess.run(
        ["bash", "-c", f'{rule}\necho "$RAY_TMP"'], env=env, capture_output=True, text=True
    )
    assert done.stdout.strip() == f"{root}/magi_lp_ray.{env.get('SLURM_JOB_ID', '0')}"
    longest = f"{done.stdout.strip()}.999/{ray_paths.LONGEST_SOCKET}"  # a machine's folder
    assert len(longest) <= ray_paths.SOCKET_PATH_LIMIT and RAY_FOLDER.startswith("magi_lp_ray.")


def test_a_new_ray_folder_sweeps_those_of_killed_drivers_first(tmp_path, monkeypatch):
    """A Ray run's folder is marked with its driver's pid; the next run removes those whose
    driver is gone (one SIGKILLed without isolation), in both places a folder can be."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    temp, fallback = tmp_path / "t", tmp_path / "r"
    for root, name in ((temp, "magi_lp_ray_dead1"), (fallback, "magi_lp_ray_dead2")):
        root.mkdir()
        (root / name / "session_latest").mkdir(parents=True)
        (root / name / run_folders.OWNER_FILE).write_text(str(dead.pid))
    (temp / "magi_lp_ray_live").mkdir()
    (temp / "magi_lp_ray_live" / run_folders.OWNER_FILE).write_text(str(os.getppid()))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(ray_paths, "RAY_FALLBACK_ROOT", str(fallback))
    monkeypatch.setattr(ray_paths, "SOCKET_PATH_LIMIT", 4096)  # pytest's folders are long
    made = Path(ray_paths.run_temp_folder())
    assert sorted(p.name for p in temp.iterdir()) == sorted(["magi_lp_ray_live", made.name])
    assert list(fallback.iterdir()) == []
