"""How a node ended, in words: the exit code or signal, its cause, and the end of its log.

`format_exit_report(node)` is what the launcher prints when a node dies: it leads with the
cause (`death_cause`: the last Python exception, a fatal native log line such as glog's `F`
lines, `Check failed` or `Fatal Python error`, or an out-of-memory kill by the kernel), then
the last lines of the node's log.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
from pathlib import Path

TAIL_LINES = 20
"""How many lines of a dead node's log the exit report shows."""


@dataclasses.dataclass(frozen=True)
class NodeExit:
    """How one node process ended.

    Attributes:
      group: the Launchpad group label the node belongs to.
      index: the node's index within its group (Launchpad's task id).
      pid: the node's process id.
      returncode: `Popen.returncode`: the exit code, or minus the signal that killed it.
      log_path: the file its stdout and stderr went to.
      known_cause: what the engine itself knows of the death, when it knows more than the
        process's end says (Ray: the machine the node ran on died), reported first.
    """

    group: str
    index: int
    pid: int
    returncode: int
    log_path: Path
    known_cause: str | None = None

    @property
    def name(self) -> str:
        """`group/index`, the name used in reports and for the log file."""
        return f"{self.group}/{self.index}"

    @property
    def status(self) -> str:
        """The exit code or the killing signal, in words."""
        return describe_returncode(self.returncode)


def describe_returncode(returncode: int) -> str:
    """Says what a `Popen.returncode` means: 'exit code 3' or 'killed by signal SIGKILL (9)'."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "unknown signal"
    return f"killed by signal {name} ({-returncode})"


def read_tail(path: str | os.PathLike, lines: int = TAIL_LINES) -> list[str]:
    """The last `lines` lines of a text file; empty when it does not exist."""
    block = 64 * 1024
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            data = b""
            while size > 0 and data.count(b"\n") <= lines:
                step = min(block, size)
                size -= step
                f.seek(size)
                data = f.read(step) + data
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]


# Lines a process writes as it dies in native code: glog's fatal lines, XLA's flag check,
# CPython's fatal error, a C++ exception nobody caught.
# The specific ones (glog `F1123 ...` and TF/XLA's `<time>: F <file>:<line>] ...`) name the
# reason; the generic ones only that it was fatal.
_FATAL_NATIVE = re.compile(
    r"^(F\d{4} .*|.*: F [\w/.-]+:\d+\] .*|.*Check failed.*|.*Unknown flags? in XLA_FLAGS.*)$"
)
_FATAL_GENERIC = re.compile(r"^(Fatal Python error.*|terminate called after throwing.*)$")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*$")
CAUSE_SCAN_BYTES = 1 << 20


def death_cause(node: NodeExit, *, stopping: bool = False) -> str | None:
    """The line of a dead node's log that says why it died, or what its end suggests.

    A native fatal line (glog `F`, `Check failed`, unknown XLA flags, `Fatal Python error`)
    comes first for a node killed by a signal; otherwise the last Python exception (the
    line after its traceback); a SIGKILL with no stop in progress is, when the log says
    nothing, most often the kernel's out-of-memory killer. The engine's own word on it
    (`NodeExit.known_cause`) comes before all of these.
    """
    if node.known_cause is not None:
        return node.known_cause
    try:
        with open(node.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - CAUSE_SCAN_BYTES))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    native = [line.strip() for line in lines if _FATAL_NATIVE.match(line.strip())] or [
        line.strip() for line in lines if _FATAL_GENERIC.match(line.strip())
    ]
    exception = None
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            for later in lines[i + 1 :]:
                if later and not later[0].isspace() and _EXCEPTION.match(later):
                    exception = later.strip()
                    break
    if native and (node.returncode < 0 or exception is None):
        return native[-1]
    if exception is not None:
        return exception
    if node.returncode == -signal.SIGKILL and not stopping:
        return _sigkill_cause(node.pid)
    return None


def _sigkill_cause(pid: int) -> str:
    """Why a node was SIGKILLed with no stop in progress: the kernel's out-of-memory killer
    when the kernel log says so (read only where it is readable), else who else might."""
    kernel_log = _read_kernel_log()
    if kernel_log is None:
        return (
            "killed by SIGKILL while no stop was in progress, and its log names no error: "
            "most often the kernel's out-of-memory killer (`dmesg | grep -i oom`; the kernel "
            "log is not readable here)"
        )
    killed = re.compile(rf"(Killed process {pid}\b|\bpid={pid}\b)")
    for line in reversed(kernel_log):
        if killed.search(line) and ("oom" in line.lower() or "out of memory" in line.lower()):
            return f"killed by the kernel's out-of-memory killer (kernel log: {line.strip()})"
    return (
        "killed by SIGKILL while no stop was in progress, and its log names no error; the "
        f"kernel log names no out-of-memory kill of pid {pid}: another process killed it"
    )


def _read_kernel_log() -> list[str] | None:
    """The kernel's log lines (`dmesg`), or None where it cannot be read (dmesg_restrict)."""
    try:
        result = subprocess.run(
            ["dmesg"], capture_output=True, text=True, errors="replace", timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.splitlines()


def format_exit_report(node: NodeExit, tail_lines: int = TAIL_LINES, stopping: bool = False) -> str:
    """A report on a node that died: which node, how, why (the line of its log that says
    so, when one does), and the last lines of its log."""
    header = f"node {node.name} (group {node.group!r}, pid {node.pid}) died: {node.status}"
    cause = death_cause(node, stopping=stopping)
    if cause is not None:
        header += f"\ncause: {cause}"
    tail = read_tail(node.log_path, tail_lines)
    if not tail:
        return f"{header}\n(its log {node.log_path} is empty)"
    body = "\n".join(f"    {line}" for line in tail)
    return f"{header}\nlast {len(tail)} lines of its log {node.log_path}:\n{body}"
