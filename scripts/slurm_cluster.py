"""A SLURM cluster of three nodes on this one machine, for the tests and for a person.

    python scripts/slurm_cluster.py up            # `make slurm-up`: prints its folder
    python scripts/slurm_cluster.py down [DIR]    # `make slurm-down`: stops it, removes DIR

What it starts (as root), all from one temp folder (`/tmp/magi_lp_slurm.XXXX`): a network
namespace with only loopback up (a `sleep` holds it), and inside it munged, one slurmctld
and three `slurmd -N n1|n2|n3` from one slurm.conf. The nodes have addresses of their own
(NodeAddr 10.254.0.1-3, the controller 10.254.0.254, all on the namespace's loopback device;
each slurmd on its own Port), so the job's servers, which listen on every interface, are
reachable from nowhere else. (Addresses outside 127/8 are also what slurmd needs: it binds
through getaddrinfo with AI_ADDRCONFIG, which finds no address family when a namespace has
only loopback addresses.) The folder holds the config, the daemons' state and logs,
`state.json` with every PID started, and `in-cluster`, a wrapper that runs a command inside
the namespace with SLURM_CONF set (`DIR/in-cluster sbatch job.sbatch`, `DIR/in-cluster bash`).

`down` stops what `up` started, by the PIDs recorded in state.json, and also every process
still in the cluster's namespace (job steps that slurmd started), then removes the folder.

SLURM and munge come from Debian's packages (slurm-wlm, munge: SLURM 22.05 on Debian 12);
`ensure_installed` installs them once with apt-get when they are missing, and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

NODES = {"n1": "10.254.0.1", "n2": "10.254.0.2", "n3": "10.254.0.3"}
"""NodeName -> NodeAddr: addresses on the namespace's loopback device, as on a private network."""
CONTROLLER = "10.254.0.254"
CONTROLLER_PORT = 16817
SLURMD_PORT = 16818  # n1's; n2, n3 the next ones
CPUS_PER_NODE = 8  # what each node declares (shared by all on this machine)
PREFIX = "magi_lp_slurm."
PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("slurmctld", "slurmd", "munged")


class Unavailable(RuntimeError):  # noqa: N818  (reads as `except Unavailable`)
    """The cluster cannot run here; the message says why, in one line."""


def ensure_installed(say=print) -> None:
    """Installs slurm-wlm and munge with apt-get if a daemon is missing (root only).

    Both legs of `make test` run at once and each may get here first: the check and the
    install hold a lock on this file, so one installs and the other then finds the daemons
    (two apt-gets at once: the second fails on dpkg's lock)."""
    with open(__file__, "rb") as this_file:
        fcntl.flock(this_file, fcntl.LOCK_EX)
        _install_if_missing(say)


def _install_if_missing(say) -> None:
    missing = [d for d in DAEMONS if not _which(d)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise Unavailable(f"{', '.join(missing)} not installed and not root to apt-get them")
    if not shutil.which("apt-get"):
        raise Unavailable(f"{', '.join(missing)} not installed and no apt-get here")
    say(f"installing {' '.join(PACKAGES)} with apt-get (once; {', '.join(missing)} missing)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES],
    ):
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            last = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:]
            raise Unavailable(f"{' '.join(command)} failed: {' '.join(last)}")
    still = [d for d in DAEMONS if not _which(d)]
    if still:
        raise Unavailable(f"apt-get installed {' '.join(PACKAGES)} but {still} are missing")


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def slurm_conf(folder: Path) -> str:
    """The cluster's slurm.conf."""
    hostname = socket.gethostname()
    lines = [
        "ClusterName=magi",
        # slurmctld runs only where SlurmctldHost names the machine; its address is its own.
        f"SlurmctldHost={hostname}({CONTROLLER})",
        "MailProg=/bin/true",
        f"SlurmctldPort={CONTROLLER_PORT}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={folder}/munge/munge.socket",
        f"StateSaveLocation={folder}/ctld",
        f"SlurmdSpoolDir={folder}/spool/%n",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"SlurmdPidFile={folder}/slurmd-%n.pid",
        f"SlurmctldLogFile={folder}/log/slurmctld.log",
        f"SlurmdLogFile={folder}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=1",
        "ReturnToService=2",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={folder}/jobcomp.txt",
        "KillWait=30",
        "MinJobAge=3600",
        "SlurmdTimeout=60",
        "SlurmdParameters=config_overrides",
        f"TmpFS={folder}/tmp",
    ]
    for index, (name, address) in enumerate(NODES.items()):
        lines.append(
            f"NodeName={name} NodeAddr={address} NodeHostname={hostname} "
            f"Port={SLURMD_PORT + index} CPUs={CPUS_PER_NODE} State=UNKNOWN"
        )
    lines.append(
        f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP"
    )
    return "\n".join(lines) + "\n"


def _addresses() -> str:
    """Shell: loopback up, with every node's and the controller's address on it."""
    commands = ["ip link set lo up"]
    commands += [f"ip addr add {a}/32 dev lo" for a in (*NODES.values(), CONTROLLER)]
    return " && ".join(commands)


class SlurmCluster:
    """A running cluster (see the module docstring); `start()` makes one, `stop()` ends it."""

    def __init__(self, folder: Path, pids: dict[str, int] | None = None):
        self.folder = Path(folder)
        self.pids = dict(pids or {})

    # --- using it ------------------------------------------------------------------------

    @property
    def conf(self) -> Path:
        """The slurm.conf."""
        return self.folder / "slurm.conf"

    @property
    def netns(self) -> str:
        """The cluster's network namespace (a /proc path)."""
        return f"/proc/{self.pids['netns']}/ns/net"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment for SLURM's commands: SLURM_CONF set."""
        return dict(os.environ if base is None else base, SLURM_CONF=str(self.conf))

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the cluster's network namespace."""
        return ["nsenter", f"--net={self.netns}", "--", *argv]

    def run(self, *argv: str, timeout: float = 30, check: bool = True) -> str:
        """Runs a SLURM command (sbatch, squeue, ...) in the cluster; returns its stdout."""
        result = subprocess.run(
            self.command(argv), env=self.env(), capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {result.returncode}: {result.stderr}")
        return result.stdout

    def node_states(self) -> dict[str, str]:
        """NodeName -> sinfo's state ("idle", "alloc", ...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def job_info(self, job_id: str) -> dict[str, str]:
        """`scontrol show job`'s fields of the job (its first component for a hetjob)."""
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False)
        fields: dict[str, str] = {}
        for line in out.splitlines()[:1]:
            for item in line.split():
                key, _, value = item.partition("=")
                fields.setdefault(key, value)
        return fields

    def processes(self) -> list[int]:
        """Every process in the cluster's namespace (daemons, job steps, nodes) but its holder."""
        try:
            ns = os.readlink(self.netns)
        except OSError:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == self.pids.get("netns"):
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/net") == ns:
                    found.append(int(entry))
            except OSError:
                continue
        return found

    def job_processes(self) -> list[int]:
        """Processes in the namespace other than the cluster's own daemons (and slurmctld's
        helper slurmscriptd): what jobs left, slurmstepd included."""
        own = {pid for name, pid in self.pids.items() if name != "netns"}
        return [
            p for p in self.processes() if p not in own and _parent(p) != self.pids.get("slurmctld")
        ]

    # --- starting and stopping ---------------------------------------------------------------

    @classmethod
    def start(cls, folder: Path | None = None, timeout: float = 60) -> SlurmCluster:
        """Starts the cluster in `folder` (a new temp folder by default); waits until every
        node is idle. Stops whatever it started if that fails."""
        if os.geteuid() != 0:
            raise Unavailable("needs root (munged, slurmctld and slurmd run as root here)")
        if not shutil.which("nsenter") or not shutil.which("unshare"):
            raise Unavailable("needs nsenter and unshare (util-linux)")
        folder = Path(folder or tempfile.mkdtemp(prefix=PREFIX))
        cluster = cls(folder)
        try:
            cluster._start(timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start(self, timeout: float) -> None:
        folder = self.folder
        for sub in ("ctld", "log", "munge", "tmp", *(f"spool/{n}" for n in NODES)):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o755)
        os.chmod(folder / "munge", 0o700)
        self.conf.write_text(slurm_conf(folder))
        key = folder / "munge/munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._save()

        holder = subprocess.Popen(
            ["unshare", "--net", "sh", "-c", f"{_addresses()} && exec sleep infinity"],
            start_new_session=True,
        )
        self.pids["netns"] = holder.pid
        self._save()
        deadline = time.monotonic() + 10
        while os.readlink(self.netns) == os.readlink("/proc/self/ns/net") or not self._lo_up():
            if holder.poll() is not None or time.monotonic() > deadline:
                raise Unavailable("could not make a network namespace (unshare --net)")
            time.sleep(0.05)

        munge = folder / "munge"
        self._daemon(
            "munged",
            [
                _which("munged"),
                "-F",
                "--force",
                f"--key-file={key}",
                f"--socket={munge}/munge.socket",
                f"--pid-file={munge}/munged.pid",
                f"--log-file={folder}/log/munged.log",
                f"--seed-file={munge}/munged.seed",
            ],
        )
        self._wait(lambda: (munge / "munge.socket").exists(), 10, "munged's socket")
        self._daemon("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        for name in NODES:
            self._daemon(
                f"slurmd-{name}", [_which("slurmd"), "-D", "-N", name, "-f", str(self.conf)]
            )
        self._wait(
            lambda: (
                set(self.node_states().values()) == {"idle"}
                and len(self.node_states()) == len(NODES)
            ),
            timeout,
            "every node idle in sinfo",
        )

    def _lo_up(self) -> bool:
        result = subprocess.run(
            ["nsenter", f"--net={self.netns}", "ip", "-o", "addr", "show", "lo"],
            capture_output=True,
            text=True,
        )
        return CONTROLLER in result.stdout

    def _daemon(self, name: str, argv: list[str | None]) -> None:
        with open(self.folder / "log" / f"{name}.out", "ab") as log:
            process = subprocess.Popen(
                self.command([str(a) for a in argv]),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env(),
                start_new_session=True,
            )
        self.pids[name] = process.pid
        self._save()

    def _wait(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for name, pid in self.pids.items():
                if not _alive(pid):
                    raise RuntimeError(
                        f"{name} (pid {pid}) ended while waiting for {what}: {self._log_tail(name)}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no {what} after {timeout:.0f} s: {self._log_tail('slurmctld')}"
                )
            time.sleep(0.2)

    def _log_tail(self, name: str) -> str:
        """The last lines a daemon wrote (the folder goes when a failed start is undone)."""
        lines = []
        for path in (self.folder / "log" / f"{name}.out", self.folder / "log" / f"{name}.log"):
            if path.is_file():
                lines += path.read_text(errors="replace").strip().splitlines()[-3:]
        return " | ".join(lines) or "no output"

    def _save(self) -> None:
        (self.folder / "state.json").write_text(json.dumps({"pids": self.pids}, indent=1))
        wrapper = self.folder / "in-cluster"
        if "netns" in self.pids:
            wrapper.write_text(
                "#!/bin/sh\n# Runs a command (default: a shell) inside the SLURM cluster.\n"
                f"export SLURM_CONF={shlex.quote(str(self.conf))}\n"
                f'exec nsenter --net={self.netns} -- "${{@:-${{SHELL:-/bin/sh}}}}"\n'
            )
            wrapper.chmod(0o755)

    def stop(self, grace: float = 10) -> list[str]:
        """Cancels any job, stops every process it started (by PID) and every process left
        in its namespace, then removes its folder. Returns what had to be SIGKILLed."""
        killed: list[str] = []
        if "slurmctld" in self.pids and _alive(self.pids["slurmctld"]):
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(
                    self.command(["scancel", "--full", "--user=root"]),
                    env=self.env(),
                    capture_output=True,
                    timeout=15,
                )
            deadline = time.monotonic() + grace
            while self.job_processes() and time.monotonic() < deadline:
                time.sleep(0.2)
        order = [n for n in self.pids if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            if name in self.pids:
                _signal(self.pids[name], signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(_alive(self.pids[n]) for n in order if n in self.pids):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for pid in self.processes():
            killed.append(_describe(pid))
            _signal(pid, signal.SIGKILL)
        if "netns" in self.pids:
            _signal(self.pids["netns"], signal.SIGKILL)
        for pid in self.pids.values():
            _reap(pid)
        shutil.rmtree(self.folder, ignore_errors=True)
        return killed


def _alive(pid: int) -> bool:
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _describe(pid: int) -> str:
    try:
        return f"{pid} " + Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:120]
    except OSError:
        return str(pid)


def _folders(given: str | None) -> list[Path]:
    if given:
        return [Path(given)]
    root = Path(tempfile.gettempdir())
    return sorted(p for p in root.glob(PREFIX + "*") if (p / "state.json").is_file())


def main(argv: list[str] | None = None) -> int:
    """`up` / `down` for `make slurm-up` / `make slurm-down`."""
    parser = argparse.ArgumentParser(
        prog="scripts/slurm_cluster.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("folder", nargs="?", help="down: the cluster's folder (default: all)")
    args = parser.parse_args(argv)
    if args.action == "up":
        try:
            ensure_installed()
            cluster = SlurmCluster.start()
        except (Unavailable, RuntimeError) as error:
            print(f"slurm-up: {error}", file=sys.stderr)
            return 1
        wrapper = cluster.folder / "in-cluster"
        print(f"SLURM cluster up: nodes {', '.join(f'{n} ({a})' for n, a in NODES.items())} idle")
        print(f"its folder (config, state, logs, PIDs): {cluster.folder}")
        print(f"use it:  {wrapper} sinfo    (or `{wrapper}` for a shell inside it)")
        print(
            f"stop it: make slurm-down  (or python scripts/slurm_cluster.py down {cluster.folder})"
        )
        return 0
    folders = _folders(args.folder)
    if not folders:
        print("slurm-down: no cluster folder found", file=sys.stderr)
        return 0
    for folder in folders:
        try:
            pids = json.loads((folder / "state.json").read_text())["pids"]
        except (OSError, ValueError, KeyError) as error:
            print(f"slurm-down: {folder}: no state.json ({error})", file=sys.stderr)
            return 1
        killed = SlurmCluster(folder, pids).stop()
        extra = f"; SIGKILLed {len(killed)} left: {'; '.join(killed)}" if killed else ""
        print(f"slurm-down: stopped the cluster of {folder} and removed it{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
