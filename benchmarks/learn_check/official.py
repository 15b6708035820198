"""The official PyTorch DrQ-v2 (facebookresearch/drqv2), run on one CPU core for comparison.

The official code is never committed here: the user gives a checkout, `check_checkout`
verifies it is the pinned commit (git HEAD, and sha256 of every file we use, so an archive
without .git verifies too), `prepare` copies those files to a scratch folder and applies
`PATCH`, our own minimal edits, each with its reason. Everything else is set by hydra
overrides in `command`. The venv is scripts/setup_official_venv.sh (requirements-official.txt).

Facts of the official code at this commit (cfgs/config.yaml, cfgs/task/easy.yaml, train.py,
drqv2.py), for the comparison: action_repeat 2, frame_stack 3, discount 0.99, nstep 3,
lr 1e-4, feature_dim 50, hidden_dim 1024, critic_target_tau 0.01, update_every_steps 2,
num_expl_steps 2000 (agent steps: uniform actions for the first 4000 frames), num_seed_frames
4000 (no updates before), stddev_schedule 'linear(1.0,0.1,100000)' for cartpole_balance (in
agent steps), stddev_clip 0.3, RandomShiftsAug pad 4 at every image size. It evaluates at
frame 0 and every eval_every_frames, not at num_train_frames (the loop stops first); the
`frame` column is global_step * action_repeat.
"""

from __future__ import annotations

import csv
import hashlib
import inspect
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

OFFICIAL_REPO = "https://github.com/facebookresearch/drqv2"
OFFICIAL_COMMIT = "c0c650b76c6e5d22a7eb5f2edffd1440fe94f8ef"

# sha256 of every file `prepare` copies, at OFFICIAL_COMMIT; cfgs/task is one digest (_tree_digest).
FILE_SHA256 = {
    "train.py": "98d7fa9b1dcc00e5842ab2e31518e7d80be03153b03d57da0cef34d3e9a3c7e4",
    "drqv2.py": "e946bf201f6bb3587d0fba20a88b8afca407c5eb6099f7a2283596ae7b6c6273",
    "dmc.py": "53a001201af007b0c258e182804546bc297305f3202807d7aeb74be1d643303f",
    "replay_buffer.py": "84e58cd8b7cfd1f92bec078ff2bb25c1033fdb0fbf121da72683160dae2620cd",
    "utils.py": "f5545e1319b4e2b5332560a165929ba3aeb9be748606bfedd4b43f02c273d154",
    "logger.py": "e479a77241120b36f36a50c1c2d669d59c7f2e9cde5f6c6bd5b9ef00d1eb2a67",
    "video.py": "6b168f9d08b2a05781da90e3a29b858533476df5ea604ae09aa502dd8aebafba",
    "cfgs/config.yaml": "6960cb71e64443eca9c4ecaa88bc87413e592390289fca055726cc5b0b18cce7",
}
TASK_DIR = "cfgs/task"
TASK_DIR_SHA256 = "de255372d222b58146ec9b8fdd1afd1d6f15ec7d2361a262969ec3da04532f30"


class OfficialCodeMissing(RuntimeError):  # noqa: N818 (the name says what is wrong)
    """The official checkout is absent, incomplete or not the pinned commit (one-line message)."""


class Edit(NamedTuple):
    """One exact-text replacement in one official file, and why we need it."""

    file: str
    old: str
    new: str
    why: str


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and its live children, from /proc: our
    agent's rows' `cpu_time` (ours_main.py), and the official one's through `TREE_CPU`."""
    tick = os.sysconf("SC_CLK_TCK")
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as f:
            pids = [me, *(int(p) for p in f.read().split())]
    except OSError:
        pids = [me]
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


TREE_CPU = "\n\n" + inspect.getsource(tree_cpu_seconds)
"""Added to train.py (its `os` import is there): `cpu_time` of each training row, read by the
very function that stamps our agent's rows."""

PATCH: list[Edit] = [
    Edit(
        "drqv2.py",
        "        self.repr_dim = 32 * 35 * 35\n",
        "        self.repr_dim = 32 * ((obs_shape[1] - 3) // 2 - 5)"
        " * ((obs_shape[2] - 3) // 2 - 5)\n",
        "the encoder's flattened size from the input (stride-2 conv, then three 3x3 convs) "
        "instead of 84x84's fixed 32*35*35",
    ),
    Edit(
        "dmc.py",
        "def make(name, frame_stack, action_repeat, seed):\n",
        "def make(name, frame_stack, action_repeat, seed, image_size=84):\n",
        "the render size becomes a parameter (default 84, the official value)",
    ),
    Edit(
        "dmc.py",
        "render_kwargs = dict(height=84, width=84, camera_id=camera_id)",
        "render_kwargs = dict(height=image_size, width=image_size, camera_id=camera_id)",
        "render at the configured size instead of the hardcoded 84x84",
    ),
    Edit(
        "train.py",
        "        self.train_env = dmc.make(self.cfg.task_name, self.cfg.frame_stack,\n"
        "                                  self.cfg.action_repeat, self.cfg.seed)\n"
        "        self.eval_env = dmc.make(self.cfg.task_name, self.cfg.frame_stack,\n"
        "                                 self.cfg.action_repeat, self.cfg.seed)\n",
        "        self.train_env = dmc.make(self.cfg.task_name, self.cfg.frame_stack,\n"
        "                                  self.cfg.action_repeat, self.cfg.seed,\n"
        "                                  self.cfg.image_size)\n"
        "        self.eval_env = dmc.make(self.cfg.task_name, self.cfg.frame_stack,\n"
        "                                 self.cfg.action_repeat, self.cfg.seed,\n"
        "                                 self.cfg.image_size)\n",
        "pass cfg.image_size to both environments (train and eval)",
    ),
    Edit(
        "cfgs/config.yaml",
        "frame_stack: 3\n",
        "frame_stack: 3\nimage_size: 84\n",
        "a config key for the render size, so `image_size=N` is a plain hydra override",
    ),
    Edit(
        "cfgs/config.yaml",
        "  - override hydra/launcher: submitit_local\n",
        "",
        "no SLURM launcher: hydra's basic launcher runs one local job (no hydra-submitit dep)",
    ),
    Edit(
        "cfgs/config.yaml",
        "  launcher:\n    timeout_min: 4300\n    cpus_per_task: 10\n    gpus_per_node: 1\n"
        "    tasks_per_node: 1\n    mem_gb: 160\n    nodes: 1\n"
        "    submitit_folder: ./exp/${now:%Y.%m.%d}/${now:%H%M%S}_${agent_cfg.experiment}/.slurm\n",
        "",
        "the submitit launcher's settings: the basic launcher's schema rejects these keys",
    ),
    Edit(
        "train.py",
        "                        log('fps', episode_frame / elapsed_time)\n",
        "                        log('fps', episode_frame / elapsed_time)\n"
        "                        log('wall_time', __import__('time').time())\n"
        "                        log('cpu_time', tree_cpu_seconds())\n",
        "the wall clock when a training episode's row is written (train.csv `wall_time`): "
        "both agents' frames/s are timed from that event, and a relaunch's gap is found "
        "by it (the restored Timer's total_time spans the gap); and the CPU seconds of this "
        "process and its children (the replay worker) at that moment (`cpu_time`)",
    ),
    Edit(
        "train.py",
        "from video import TrainVideoRecorder, VideoRecorder\n",
        "from video import TrainVideoRecorder, VideoRecorder\n" + TREE_CPU,
        "the process tree's CPU seconds (this process and the replay worker), read from /proc",
    ),
    Edit(
        "train.py",
        "        with snapshot.open('wb') as f:\n            torch.save(payload, f)\n",
        "        partial = snapshot.with_name('snapshot.pt.partial')\n"
        "        with partial.open('wb') as f:\n            torch.save(payload, f)\n"
        "        os.replace(partial, snapshot)\n",
        "the snapshot is written beside and renamed into place: a run killed while writing "
        "it (every episode) kept a truncated snapshot.pt that its relaunch could not load",
    ),
    Edit(
        "train.py",
        "            payload = torch.load(f)\n",
        "            payload = torch.load(f, weights_only=False)\n",
        "torch >= 2.6 loads only tensors by default (weights_only=True); the snapshot is the "
        "pickled agent and timer, which the official code wrote itself",
    ),
    Edit(
        "replay_buffer.py",
        "    random.seed(seed)\n",
        "    random.seed(int(seed))\n",
        "Python 3.11's random.seed refuses the numpy uint32 the replay worker derives its "
        "seed from",
    ),
    Edit(
        "logger.py",
        "import torchvision\nfrom termcolor import colored\n"
        "from torch.utils.tensorboard import SummaryWriter\n",
        "from termcolor import colored\n",
        "torchvision is imported but unused; tensorboard is needed only with use_tb=true",
    ),
    Edit(
        "logger.py",
        "        if use_tb:\n            self._sw = SummaryWriter(",
        "        if use_tb:\n            from torch.utils.tensorboard import SummaryWriter\n\n"
        "            self._sw = SummaryWriter(",
        "import tensorboard only where use_tb=true needs it",
    ),
    Edit(
        "video.py",
        "import cv2\nimport imageio\n",
        "import imageio\n",
        "opencv is needed only for train videos (save_train_video=false here)",
    ),
    Edit(
        "video.py",
        "        if self.enabled:\n            frame = cv2.resize(",
        "        if self.enabled:\n            import cv2\n\n            frame = cv2.resize(",
        "import opencv only where a train video is recorded",
    ),
]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree_digest(folder: Path) -> str:
    """One sha256 over the task configs: each name and its bytes, sorted by name."""
    h = hashlib.sha256()
    for p in sorted(folder.glob("*.yaml")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _fetch_hint(path: Path) -> str:
    return f"git clone {OFFICIAL_REPO} {path} && git -C {path} checkout {OFFICIAL_COMMIT[:7]}"


def check_checkout(path: Path) -> None:
    """Raises OfficialCodeMissing unless `path` holds the official code at OFFICIAL_COMMIT.

    A git checkout must be at the commit; with or without git, every file we copy must have
    its recorded sha256 (so an unpacked archive verifies, and a dirty checkout does not).
    """
    path = Path(path)
    missing = [f for f in [*FILE_SHA256, TASK_DIR] if not (path / f).exists()]
    if missing:
        raise OfficialCodeMissing(
            f"official DrQ-v2 not found at {path} (no {missing[0]}): {_fetch_hint(path)}"
        )
    if (path / ".git").exists():
        head = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        if head != OFFICIAL_COMMIT:
            raise OfficialCodeMissing(
                f"{path} is at commit {head or '?'}, not {OFFICIAL_COMMIT}: "
                f"git -C {path} checkout {OFFICIAL_COMMIT[:7]}"
            )
    for name, digest in FILE_SHA256.items():
        if _sha256(path / name) != digest:
            raise OfficialCodeMissing(
                f"{path / name} differs from commit {OFFICIAL_COMMIT[:7]}: {_fetch_hint(path)}"
            )
    if _tree_digest(path / TASK_DIR) != TASK_DIR_SHA256:
        raise OfficialCodeMissing(
            f"{path / TASK_DIR} differs from commit {OFFICIAL_COMMIT[:7]}: {_fetch_hint(path)}"
        )


def copy_files(checkout: Path, scratch: Path) -> Path:
    """Checks `checkout` and copies the files we use, unpatched, into a fresh `scratch`: a
    checkout of its own, which `check_checkout` passes (how one travels to a GPU machine)."""
    checkout, scratch = Path(checkout), Path(scratch)
    check_checkout(checkout)
    if scratch.exists():
        shutil.rmtree(scratch)
    (scratch / "cfgs").mkdir(parents=True)
    for name in FILE_SHA256:
        shutil.copyfile(checkout / name, scratch / name)
    shutil.copytree(checkout / TASK_DIR, scratch / TASK_DIR)
    return scratch


def prepare(checkout: Path, scratch: Path) -> Path:
    """Checks `checkout`, copies the files we use into a fresh `scratch`, applies PATCH.

    Returns the folder to run train.py in (`scratch` itself). A patch text not found exactly
    once raises RuntimeError with one line: the pinned hashes make that a bug in PATCH.
    """
    scratch = copy_files(checkout, scratch)
    for edit in PATCH:
        target = scratch / edit.file
        text = target.read_text()
        count = text.count(edit.old)
        if count != 1:
            raise RuntimeError(
                f"patch for {edit.file} ({edit.why}): old text found {count} times, not once"
            )
        target.write_text(text.replace(edit.old, edit.new))
    return scratch


def temp_folder(folder: Path) -> Path:
    """The run's TMPDIR: a folder in the system's temp folder named after the run's folder.
    Not inside the run's folder: multiprocessing puts a Unix socket in TMPDIR, and a socket's
    path may not exceed 107 bytes (the run folders' paths are about 100)."""
    digest = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"magi_lp_official_{digest}"


def remove_temp(env: dict[str, str]) -> None:
    """Removes the TMPDIR `environment()` made, once its launch has ended."""
    shutil.rmtree(env["TMPDIR"], ignore_errors=True)


def environment(folder: Path) -> dict[str, str]:
    """Environment variables for the run kept in `folder` (add them to os.environ's copy).

    One torch thread comes from OMP_NUM_THREADS=1 (torch reads it at import; no patch);
    MUJOCO_GL=egl is what train.py sets itself anyway (headless EGL; llvmpipe on a CPU-only
    machine, where LP_NUM_THREADS=0 keeps rendering in the calling thread). torch (2.13) makes
    its inductor cache, $TMPDIR/torchinductor_<user>, at an optimizer's first step unless
    TORCHINDUCTOR_CACHE_DIR names another place: the run's folder, so that a run leaves
    nothing in /tmp. Mesa's EGL keeps its shader cache in the home folder (found through the
    password database, not $HOME) unless MESA_SHADER_CACHE_DIR names another place: the run's
    folder too (scripts/write_home_pth.sh does the same for this project's venvs). TMPDIR is
    the run's own short folder in the system's temp folder (`temp_folder`), made empty here:
    the replay worker's multiprocessing makes pymp-* there, which a launch stopped by a signal
    (each session's end) leaves; the caller removes it after the launch (`remove_temp`).
    """
    temp = temp_folder(folder)
    shutil.rmtree(temp, ignore_errors=True)  # what a stopped launch left
    temp.mkdir(parents=True)
    return {
        "TMPDIR": str(temp),
        "TORCHINDUCTOR_CACHE_DIR": str(Path(folder) / "torchinductor"),
        "MESA_SHADER_CACHE_DIR": str(Path(folder) / "mesa_shader_cache"),
        "MUJOCO_GL": "egl",
        "PYOPENGL_PLATFORM": "egl",
        "LP_NUM_THREADS": "0",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "HYDRA_FULL_ERROR": "1",
    }


def command(
    code_dir: Path,
    python: Path,
    *,
    task: str,
    seed: int,
    image_size: int,
    batch_size: int,
    train_frames: int,
    eval_every_frames: int,
    eval_episodes: int,
    seed_frames: int,
    replay_size: int,
    workdir: Path,
) -> list[str]:
    """The command line: train.py with hydra overrides; run it with `environment()`.

    Hydra changes into `workdir` (hydra.run.dir), where eval.csv, train.csv and snapshot.pt
    appear. One replay worker process (the official default is 4); no videos or tensorboard.
    """
    return [
        str(python),
        str(Path(code_dir) / "train.py"),
        f"task@_global_={task}",  # hydra 1.3 spelling of the README's `task=`
        f"seed={seed}",
        f"image_size={image_size}",
        f"batch_size={batch_size}",
        f"num_train_frames={train_frames}",
        f"num_seed_frames={seed_frames}",
        f"eval_every_frames={eval_every_frames}",
        f"num_eval_episodes={eval_episodes}",
        f"replay_buffer_size={replay_size}",
        "replay_buffer_num_workers=1",
        "device=cpu",
        "save_video=false",
        "save_train_video=false",
        # snapshot.pt at each episode's start, and the replay's episodes kept on disk: a
        # relaunch in the same hydra.run.dir resumes from them (train.py's main).
        "save_snapshot=true",
        "use_tb=false",
        f"hydra.run.dir={workdir}",
    ]


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def read_result(workdir: Path) -> dict:
    """Parses the run's eval.csv and train.csv (columns written by logger.py and train.py).

    eval.csv: frame, step, episode, episode_length, episode_reward (mean over the eval
    episodes), total_time. train.csv, one row per training episode once updates have begun:
    frame, ..., total_time and (our patch) wall_time and cpu_time, written when the episode
    ends. Its
    Logger drops the rows a relaunch writes again (`_remove_old_entries`). Returns the
    evaluations, each training episode's (end frame, wall_time) for runs.episode_windows,
    and the training episodes' rewards.
    """
    workdir = Path(workdir)
    evals = [
        (int(float(r["frame"])), float(r["episode_reward"])) for r in _rows(workdir / "eval.csv")
    ]
    train = _rows(workdir / "train.csv")
    return {
        "evaluations": evals,
        "episode_ends": [
            (
                int(float(r["frame"])),
                float(r["wall_time"]),
                float(r["cpu_time"]) if r.get("cpu_time") else None,
            )
            for r in train
            if r.get("wall_time")
        ],
        "train_episode_rewards": [
            (int(float(r["frame"])), float(r["episode_reward"])) for r in train
        ],
    }
