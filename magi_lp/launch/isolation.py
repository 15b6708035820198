"""Keep node RPC ports off the network: run the launcher in a private network namespace.

Why: Launchpad's Courier servers and Reverb listen on all interfaces ([::]) without
authentication, and Courier's argument decoder imports and calls any Python callable a caller
names, so anyone who can reach a node's port can run code as the user. A local run needs no
network at all between its nodes, only loopback.

How: an entry point calls `run_isolated_if_needed(mode, sys.argv)` first thing, before it
imports TensorFlow, JAX or Launchpad. Unless isolation is off or the process is already
isolated, it re-executes the same command in a child that has its own network namespace, in
which only `lo` exists and is up, waits for it, forwards signals to it and returns its exit
code. Every node the launcher starts inherits the namespace, so nodes reach each other over
loopback while nothing outside the machine's loopback -- and nothing on the host's own
interfaces either -- can connect to them. The namespace is made with unshare(2) through
ctypes (no `unshare` or `ip` binary needed):
- root: a new network namespace only (CLONE_NEWNET); if that is refused (a container without
  CAP_SYS_ADMIN), a user namespace as below, mapping uid 0 to itself (needs CAP_SETFCAP).
- any other user: a new user namespace plus network namespace (CLONE_NEWUSER|CLONE_NEWNET),
  where the user's uid and gid map to themselves (not to root, so the program sees the same
  uid, home and file ownership as outside). Capabilities in the new namespace are used only
  to bring `lo` up before exec and are gone once the program runs. This needs a kernel that
  allows unprivileged user namespaces.
The child's network is loopback only in every sense: no internet (Weights & Biases, dataset
downloads) from inside an isolated run.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Literal

from magi_lp import console
from magi_lp.config_schema import fact_refusal, refusal
from magi_lp.errors import ConfigError
from magi_lp.launch import processes, run_folders

IsolationMode = Literal["auto", "required", "off"]
MODES: tuple[str, ...] = ("auto", "required", "off")

# Set in the isolated child to the network namespace it left ("net:[4026531840]"). A process
# counts as isolated only when it is in a different namespace from that one, so a stale or
# copied variable never switches isolation off.
MARKER_ENV = "MAGI_LP_NETNS"

EXPOSURE = "node RPC ports (Courier, Reverb) listen on all interfaces without authentication"
EXPOSURES = {
    "reverb": EXPOSURE,
    # The embedded Ray binds to loopback and asks for a token made for the run
    # (`magi_lp.engines.ray_seam`; tests/test_ray_engine.py reads every Ray process's sockets).
    "served": (
        "Ray's ports listen on this machine's loopback only, behind a token made for the run; "
        "the nodes share this machine's network"
    ),
    "in_process": "the run serves no ports (one process); it shares this machine's network",
}
"""What a run outside a private network namespace exposes, by how its engine's nodes talk
(`magi_lp.engines.Engine.transport`): Launchpad's Courier and Reverb serve on every interface;
Ray's embedded cluster on loopback only."""


def exposure(transport: str = "reverb") -> str:
    """`EXPOSURES[transport]`: what an unisolated run of that engine exposes."""
    return EXPOSURES.get(transport, EXPOSURE)


FIX = (
    "enable unprivileged user namespaces (sysctl -w kernel.unprivileged_userns_clone=1, "
    "user.max_user_namespaces > 0, or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0), "
    "run as root, or set isolation=off to run with node ports exposed"
)

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ_SIZE = 40
_SI_KERNEL = 0x80  # si_code of a signal the kernel sent, e.g. the terminal's Ctrl-C
_FORWARDED_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
# The terminal sends these to the whole foreground process group, the child included.
_TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT)


@dataclasses.dataclass(frozen=True)
class IsolationSupport:
    """Whether this process can start a child in a private network namespace.

    `method` says how ("net namespace" as root, "user+net namespace" otherwise); `reason`
    says why not when `available` is false.
    """

    available: bool
    method: str
    reason: str


class _UnavailableError(Exception):
    """The namespace could not be set up; the message says which step failed and why."""


def check_mode(mode: str) -> IsolationMode:
    """Returns `mode` if it is a valid isolation mode, else raises ConfigError naming the key."""
    if mode not in MODES:
        allowed = " or ".join(repr(m) for m in MODES)
        raise ConfigError(
            refusal("isolation", allowed, mode, "e.g. isolation='auto' (the default)")
        )
    return mode  # type: ignore[return-value]


def is_isolated() -> bool:
    """True inside a namespace made by `run_isolated_if_needed` (or its nodes)."""
    outer = os.environ.get(MARKER_ENV)
    current = _netns_id("self")
    return bool(outer) and current is not None and current != outer


def probe() -> IsolationSupport:
    """Tries to start a trivial child in a private network namespace with `lo` up.

    Costs one short-lived process (times in docs/launchpad-notes.md); use it for plans and
    messages, not before a launch (`run_isolated_if_needed` finds out by trying).
    """
    if not sys.platform.startswith("linux"):
        return IsolationSupport(False, "", "network namespaces exist only on Linux")
    try:
        child = _start_in_private_netns(
            [sys.executable, "-I", "-S", "-c", ""], env=None, forward_signals=False
        )
    except _UnavailableError as e:
        return IsolationSupport(False, "", str(e))
    child.wait()
    return IsolationSupport(True, child.method, "")


def describe(mode: str, transport: str = "reverb") -> str:
    """One line for the dry-run plan: whether a launch in `mode` would be isolated, and how
    (`transport`: the engine's, for what an unisolated run exposes)."""
    mode = check_mode(mode)
    if mode == "off":
        return f"isolated: no (isolation=off: {exposure(transport)})"
    if is_isolated():
        return "isolated: yes (already inside a private network namespace)"
    support = probe()
    if support.available:
        return f"isolated: yes ({support.method}, loopback only)"
    if mode == "required":
        return f"isolated: no: {support.reason} (isolation=required: the launch will refuse)"
    return (
        f"isolated: no: {support.reason} (isolation=auto: the launch goes on, "
        f"{exposure(transport)})"
    )


def run_isolated_if_needed(mode: str, argv: list[str], transport: str = "reverb") -> int | None:
    """Re-runs this program in a private network namespace unless that is done or not wanted.

    Call it at the very top of an entry point, before importing TensorFlow, JAX or Launchpad:
    the child is set up between fork and exec, which is safe only while this process has no
    other threads.

        code = isolation.run_isolated_if_needed(mode, sys.argv)
        if code is not None:
            sys.exit(code)

    Args:
      mode: "auto" (isolate when the kernel allows it, else say so in one line and go on),
        "required" (refuse to run unisolated) or "off" (never isolate; say what is exposed).
      argv: the program's arguments as in `sys.argv`; the interpreter and its options
        (`-m module`, `-c code`, `-u`, ...) are taken from `sys.orig_argv`.
      transport: the engine's (`Engine.transport`): what an unisolated run exposes, in its
        line.

    Returns:
      None when this process should go on with the run itself (already isolated, mode off,
      or isolation unavailable under auto). Otherwise the isolated child's exit status, to
      exit with: its exit code, or 128 + N when signal N killed it. SIGINT, SIGTERM, SIGHUP,
      SIGQUIT, SIGUSR1 and SIGUSR2 sent to this process are passed on to the child while it
      runs (except a terminal's Ctrl-C, which the terminal already delivered to it), and the
      child gets SIGTERM if this process dies.

    Raises:
      ConfigError: mode is not valid, or mode is "required" and isolation cannot be set up.
    """
    mode = check_mode(mode)
    if mode == "off":
        console.say(f"isolation=off: {exposure(transport)}.", source="isolation")
        return None
    if is_isolated():
        return None
    own_netns = _netns_id("self")
    if not sys.platform.startswith("linux") or own_netns is None:
        return _unavailable(mode, "network namespaces need Linux with /proc mounted", transport)
    env = dict(os.environ)
    env[MARKER_ENV] = own_netns
    try:
        child = _start_in_private_netns(_reexec_command(argv), env=env, forward_signals=True)
    except _UnavailableError as e:
        reason = str(e)
    else:
        console.say(
            f"isolated: node ports are reachable over loopback only ({child.method}); "
            "the run has no network access beyond this machine's loopback.",
            source="isolation",
        )
        return child.wait()
    return _unavailable(mode, reason, transport)


def _clean_up_after(child: _IsolatedChild) -> None:
    """Once the isolated program has ended: ends what it left in its namespace and removes
    the temp folders of runs whose launcher is gone; says so after a kill, or when processes
    were left.

    A launcher that is SIGKILLed (by hand, the OOM killer) cannot stop its nodes or remove
    its temp folder. Launchpad's nodes die with it (a parent-death signal); Ray's dashboard
    and runtime-env agents outlived its driver, re-parented to init (here 1-3 minutes, until
    they noticed their raylet gone), and the run's Ray folder stayed in /tmp (seen
    2026-11-29). Every process in the namespace belongs to the run (the namespace is made
    for it alone, and held by `child` until this is done), so all of them are ended here."""
    left = child.end_left_behind()
    folders = [
        folder
        for root in dict.fromkeys((tempfile.gettempdir(), "/tmp"))
        for folder in run_folders.sweep_stale_run_folders(root)
    ]
    done = []
    if left:
        names = ", ".join(
            name if count == 1 else f"{name} x{count}"
            for name, count in sorted(collections.Counter(left).items())
        )
        what = "the process" if len(left) == 1 else f"the {len(left)} processes"
        done.append(f"ended {what} it left ({names})")
    if folders:
        what = "temp folder" if len(folders) == 1 else f"{len(folders)} temp folders"
        done.append(f"removed the {what} of killed runs ({', '.join(map(str, folders))})")
    killed = child.killed_by()
    if killed is not None:
        console.say(
            f"the run's process (pid {child.proc.pid}) was killed by {killed}"
            + "".join(f"; {what}" for what in done)
            + "; the same command resumes from the workdir's newest checkpoint, if it has one",
            source="isolation",
        )
    elif left:
        console.say(f"the run {done[0]}", source="isolation")


# --- the child -----------------------------------------------------------------------------


class _IsolatedChild:
    """The re-executed program; signals in `watched` are held back for `wait` to forward."""

    def __init__(self, proc: subprocess.Popen, method: str, watched: set[int], old_mask: set[int]):
        self.proc = proc
        self.method = method
        # The child's own namespace (made before it reported), held open until the clean-up:
        # a namespace nothing holds is freed when its last process ends, and its number is
        # given to the next one made on the machine, which a scan by number would then take
        # for the run's (reproduced in review: unrelated processes killed).
        self._netns_fd: int | None = None
        with contextlib.suppress(OSError):
            fd = os.open(f"/proc/{proc.pid}/ns/net", os.O_RDONLY)
            if os.fstat(fd).st_ino != os.stat("/proc/self/ns/net").st_ino:
                self._netns_fd = fd
            else:  # never our own: that would end every process around us
                os.close(fd)
        self._watched = watched
        self._old_mask = old_mask

    def killed_by(self) -> str | None:
        """The signal that ended the child (after `wait`), by name; None if it exited."""
        code = self.proc.returncode
        if code is None or code >= 0:
            return None
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
        return f"signal {-code}"

    def end_left_behind(self, passes: int = 5, wait_s: float = 2.0) -> list[str]:
        """SIGKILLs every process still in the child's network namespace (after the child
        ended), again while a pass finds more (one may fork meanwhile), and waits up to
        `wait_s` for them to be gone; returns their names. Then lets the namespace go."""
        if self._netns_fd is None:
            return []
        ours = os.fstat(self._netns_fd)
        left: dict[int, str] = {}
        try:
            for _ in range(passes):
                found = {
                    pid: name
                    for pid in _pids()
                    if pid not in left and (name := _kill_if_in(pid, ours)) is not None
                }
                if not found:
                    break
                left.update(found)
            deadline = time.monotonic() + wait_s
            while any(_running(pid) for pid in left) and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            os.close(self._netns_fd)
            self._netns_fd = None
        return list(left.values())

    def wait(self) -> int:
        """Waits for the child, forwarding signals, then cleans up after it
        (`_clean_up_after`) with the same signals still held (a Ctrl-C meant for a run that
        has ended is dropped); returns its exit status (128+N if killed)."""
        try:
            while self.proc.poll() is None:
                if not self._watched:
                    self.proc.wait()
                    break
                info = signal.sigtimedwait(self._watched, 1.0)
                if info is not None and _should_forward(info, self.proc.pid):
                    with contextlib.suppress(ProcessLookupError):  # it just exited
                        os.kill(self.proc.pid, info.si_signo)
            try:
                _clean_up_after(self)
            except Exception as error:  # the exit status comes back whatever happens here
                console.say(f"cleaning up after the run failed: {error}", source="isolation")
            while self._watched and signal.sigtimedwait(self._watched, 0) is not None:
                pass
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._old_mask)
        code = self.proc.returncode
        return 128 - code if code < 0 else code


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _kill_if_in(pid: int, netns: os.stat_result) -> str | None:
    """SIGKILLs `pid` if it is in network namespace `netns` (not this process); its name
    then, else None. Through a pidfd where there is one: a pid reused between the check and
    the signal is not hit."""
    if pid == os.getpid():
        return None
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):
        handle = None  # gone, or no pidfd here: the plain pid
    try:
        try:
            seen = os.stat(f"/proc/{pid}/ns/net")
        except OSError:
            return None
        if (seen.st_dev, seen.st_ino) != (netns.st_dev, netns.st_ino):
            return None
        command = _command_name(pid)  # first: a killed process's is soon gone
        try:
            if handle is not None:
                signal.pidfd_send_signal(handle, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            return None  # it ended meanwhile
        return os.path.basename(command) or f"pid {pid}"
    finally:
        if handle is not None:
            os.close(handle)


def _command_name(pid: int) -> str:
    """The program `pid` runs: its command line's first word (Ray's processes put their
    title there: ray::DashboardAgent), else its kernel name; "" if neither reads."""
    for name, part in (("cmdline", lambda raw: raw.split(b"\0")[0]), ("comm", bytes.strip)):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                found = part(f.read()).decode(errors="replace")
        except OSError:
            continue
        if found:
            return found
    return ""


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _should_forward(info: signal.struct_siginfo, child_pid: int) -> bool:
    """Whether a signal this process got should be passed on to the child."""
    if info.si_signo == signal.SIGCHLD:
        return False
    if info.si_code == _SI_KERNEL and info.si_signo in _TERMINAL_SIGNALS:
        # The terminal's Ctrl-C / Ctrl-\ went to this process's whole group. If the child is
        # still in it, it has its copy; a second one would make Launchpad kill, not stop.
        with contextlib.suppress(ProcessLookupError):
            return os.getpgid(child_pid) != os.getpgrp()
        return False
    return True


def _start_in_private_netns(
    command: list[str], env: dict[str, str] | None, forward_signals: bool
) -> _IsolatedChild:
    """Starts `command` in a new network namespace with `lo` up.

    Raises _UnavailableError, saying which step failed and why, when the namespace cannot be
    made. With forward_signals, the signals to forward are blocked here, before the fork, so
    that none sent in between is lost; the child's `wait` takes them.
    """
    attempts = [("user+net namespace", _CLONE_NEWUSER | _CLONE_NEWNET)]
    if os.geteuid() == 0:
        attempts.insert(0, ("net namespace", _CLONE_NEWNET))
    # Everything the forked child needs is prepared here: between fork and exec it only makes
    # system calls.
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid, parent = os.geteuid(), os.getegid(), os.getpid()
    maps = {
        "/proc/self/setgroups": b"deny",
        "/proc/self/uid_map": f"{uid} {uid} 1".encode(),
        "/proc/self/gid_map": f"{gid} {gid} 1".encode(),
    }
    watched: set[int] = set()
    if forward_signals:
        # A signal this process inherited as ignored (SIGHUP under nohup) stays unforwarded;
        # the child inherits the same disposition anyway.
        forwarded = {s for s in _FORWARDED_SIGNALS if signal.getsignal(s) != signal.SIG_IGN}
        watched = {*forwarded, signal.SIGCHLD}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    report_r, report_w = os.pipe()

    def enter_namespace() -> None:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            method = _unshare(libc, attempts, maps)
            _bring_loopback_up()
            processes.die_with_parent(signal.SIGTERM, libc=libc)
            if os.getppid() != parent:  # the parent died before prctl took effect
                os.kill(os.getpid(), signal.SIGTERM)
            os.write(report_w, f"ok {method}".encode())
        except BaseException as e:
            detail = e.strerror if isinstance(e, OSError) and e.strerror else repr(e)
            os.write(report_w, f"error {detail}".encode())
            raise

    try:
        try:
            proc = subprocess.Popen(command, env=env, preexec_fn=enter_namespace)
        except subprocess.SubprocessError:
            proc = None  # enter_namespace failed; the report says why
        finally:
            os.close(report_w)
        status, _, detail = _read_all(report_r).decode(errors="replace").partition(" ")
        if proc is None or status != "ok":
            raise _UnavailableError(detail or "the namespace set-up failed without saying why")
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        raise
    finally:
        os.close(report_r)
    return _IsolatedChild(proc, detail, watched, old_mask)


def _unshare(libc: ctypes.CDLL, attempts: list[tuple[str, int]], maps: dict[str, bytes]) -> str:
    """In the forked child: moves into a new network namespace; returns the method used."""
    failures = []
    for method, flags in attempts:
        if libc.unshare(flags) == 0:
            if flags & _CLONE_NEWUSER:
                for path, content in maps.items():
                    _write_proc_file(path, content)
            return method
        err = ctypes.get_errno()
        names = "|".join(
            name
            for name, bit in (("CLONE_NEWUSER", _CLONE_NEWUSER), ("CLONE_NEWNET", _CLONE_NEWNET))
            if flags & bit
        )
        failures.append(f"unshare({names}): {errno.errorcode.get(err, err)} {os.strerror(err)}")
    raise OSError(errno.EPERM, "; ".join(failures) + _blocking_settings())


def _write_proc_file(path: str, content: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, content)
        finally:
            os.close(fd)
    except OSError as e:
        hint = ""
        if e.errno == errno.EPERM and content.startswith(b"0 "):
            hint = " (mapping uid 0 needs CAP_SETFCAP)"
        raise OSError(
            e.errno, f"writing {content.decode()!r} to {path}: {e.strerror}{hint}"
        ) from None


def _bring_loopback_up() -> None:
    """Sets IFF_UP on `lo` with an ioctl; falls back to iproute2's `ip` if that fails."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            request = struct.pack("16sH", b"lo", 0).ljust(_IFREQ_SIZE, b"\0")
            flags = struct.unpack_from("16sH", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
            request = struct.pack("16sH", b"lo", flags | _IFF_UP).ljust(_IFREQ_SIZE, b"\0")
            fcntl.ioctl(s, _SIOCSIFFLAGS, request)
        return
    except OSError as ioctl_error:
        try:
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as ip_error:
            raise OSError(
                errno.EPERM,
                f"bringing lo up: ioctl(SIOCSIFFLAGS): {ioctl_error.strerror}; "
                f"`ip link set lo up`: {ip_error}",
            ) from None


def _blocking_settings() -> str:
    """The kernel settings that forbid user namespaces here, as a parenthesised note."""
    notes = []
    for path, bad in (
        ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
        ("/proc/sys/user/max_user_namespaces", "0"),
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"),
    ):
        try:
            with open(path) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value == bad:
            notes.append(f"{path[len('/proc/sys/') :].replace('/', '.')}={value}")
    return f" ({', '.join(notes)})" if notes else ""


def _unavailable(mode: IsolationMode, reason: str, transport: str = "reverb") -> None:
    if mode == "required":
        raise ConfigError(
            fact_refusal(
                "isolation=required, but a private network namespace cannot be made", reason, FIX
            )
        )
    console.say(f"isolation unavailable ({reason}); {exposure(transport)}.", source="isolation")
    return None


def _reexec_command(argv: list[str]) -> list[str]:
    """The interpreter, its options (e.g. `-m pkg.mod`) from sys.orig_argv, then argv[1:]."""
    orig = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    interpreter_part = orig[1 : len(orig) - len(sys.argv) + 1]
    return [sys.executable, *interpreter_part, *argv[1:]]


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


def _netns_id(pid: str | int) -> str | None:
    """The network namespace of `pid` as its /proc link names it ("net:[4026531840]")."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None
