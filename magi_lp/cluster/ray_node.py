"""One machine's Ray node in a SLURM step: up until the driver is done, then ended entirely.

The Ray SLURM script runs `python -m magi_lp.cluster.ray_node ... -- ray start ... --block` as
each machine's step. It starts the `ray start` command
given after `--` and then:
- keeps Ray up through the job's SIGTERM. `scancel` (or the time limit) sends SIGTERM to every
  process of every step at once; Ray's processes would exit on it, and the program with them,
  before the driver's stop in tiers (actors, then the learner's final save while the counter
  still answers). So `ray start` and everything it starts run with SIGTERM blocked (the mask
  is inherited through fork and exec; Ray blocks SIGINT the same way), and this process only
  notes the SIGTERM. SLURM's SIGKILL after KillWait still ends everything;
- ends Ray when told: the head's step when the stop file appears (the batch script makes it
  once the driver has ended; it runs on the head's machine), the other machines' steps once
  the head's GCS stops answering. Ray is ended by SIGKILL of every process this one started,
  however deep: it is their subreaper (PR_SET_CHILD_SUBREAPER), so a Ray process whose parent
  died (Ray's agents, when their raylet goes) stays below it instead of going to init, where
  SLURM's process tracking loses it; Ray's workers are process-group leaders of their own, so
  a process group would miss them. Then Ray's temp folder is removed;
- reports: exit 0 after a stop it was told of, 1 when `ray start` ended by itself (a Ray
  process of this machine died: the machine's nodes are lost), with one line naming the
  machine.

`ray start`'s own output goes to `--log`; this module's lines go to stdout (the job's output).
No Ray import: it runs the `ray` CLI.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from magi_lp.launch import processes

MARKER_VAR = "MAGI_LP_RAY_NODE"
"""Every process of one machine's Ray starts with this variable, set to the step's own value
(found while it is in /proc/<pid>/environ: Ray's processes overwrite theirs with their title)."""

_PR_SET_CHILD_SUBREAPER = 36

POLL_S = 0.25
HEAD_LOST_AFTER = 4
"""The head's GCS refusing this many polls in a row (about 1 s): the head's Ray is gone."""


def _say(host: str, text: str) -> None:
    print(f"magi_lp: Ray on {host}: {text}", flush=True)


def _reachable(address: str, timeout: float = 1.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def _become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process, not to init (Linux >= 3.4)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _end_everything(marker: str) -> list[str]:
    """SIGKILLs every descendant of this process and every process with the marker; waits
    until they are gone; returns `pid (name)` of each."""
    marked = processes.processes_marked(MARKER_VAR, marker)
    ended = processes.end_children(wait_s=10.0, also=marked)
    _reap()
    return ended


def _reap() -> None:
    """Collects the exit status of orphans re-parented here."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """`command` with SIGTERM (and SIGINT) blocked: Ray's processes inherit the mask."""
    log.parent.mkdir(parents=True, exist_ok=True)
    blocked = {signal.SIGTERM, signal.SIGINT}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        with open(log, "ab") as out:
            return subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run(args: argparse.Namespace, command: list[str]) -> int:
    host = args.host
    marker = f"{host}-{os.getpid()}-{time.time_ns()}"
    env = dict(os.environ, **{MARKER_VAR: marker})
    # Ray runs its workers (the program's nodes) at nice 15 unless told otherwise, below
    # everything else on the machine; the embedded Ray of `--launcher ray` sets 0 too.
    env.setdefault("RAY_worker_niceness", "0")
    temp = Path(args.temp_dir) if args.temp_dir else None
    if temp is not None:
        temp.mkdir(parents=True, exist_ok=True)
        temp.chmod(0o700)  # Ray's sockets and session files: this user's only
    terms: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: terms.append(time.monotonic()))
    _become_subreaper()
    child = _start(command, env, Path(args.log))
    head_seen, head_misses, reason, code = False, 0, "", 0
    told_term = False
    while True:
        returned = child.poll()
        if returned is not None:
            reason, code = f"`ray start` ended by itself (exit code {returned})", 1
            break
        if terms and not told_term:
            told_term = True
            _say(host, "SIGTERM: Ray stays up until the driver has stopped the program")
        if args.stop_file and os.path.exists(args.stop_file):
            reason = "the driver has ended"
            break
        if args.head:
            if _reachable(args.head):
                head_seen, head_misses = True, 0
            elif head_seen:
                head_misses += 1
                if head_misses >= HEAD_LOST_AFTER:
                    reason = f"the head's Ray at {args.head} has stopped"
                    break
        time.sleep(POLL_S)
    returned = child.poll()
    left = _end_everything(marker)
    if returned is None:
        child.wait()
    if temp is not None:
        shutil.rmtree(temp, ignore_errors=True)
    if code:
        _say(
            host,
            f"{reason}; this machine's nodes are lost (its log: {args.log}); "
            f"{len(left)} process(es) of it ended",
        )
    else:
        _say(host, f"stopped: {reason}; {len(left)} process(es) ended")
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m magi_lp.cluster.ray_node OPTIONS -- ray start ...", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m magi_lp.cluster.ray_node")
    parser.add_argument("--host", required=True, help="the machine's name in the host plan")
    parser.add_argument("--log", required=True, help="where `ray start` writes")
    parser.add_argument("--stop-file", default="", help="the head: stop once this exists")
    parser.add_argument("--head", default="", help="the others: stop once this GCS is gone")
    parser.add_argument("--temp-dir", default="", help="Ray's --temp-dir: made private, removed")
    args = parser.parse_args(argv[:split])
    return run(args, argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main())
