"""The Ray 2.60 internals the Ray engine relies on, in one place.

Ray's public API (`ray.init`, `ray.remote`, actor options, `runtime_env`, `ray.get`,
`ray.wait`, `ray.kill`, `ray.shutdown`) is used as documented everywhere else. What it does
not offer comes from here, each with what breaks if an upgrade changes it:

- `ray._raylet.Config.initialize("")`: Ray reads `RAY_AUTH_MODE` once, when it is imported;
  a run that turns token authentication on with a token of its own (in `RAY_AUTH_TOKEN`,
  never in `~/.ray/auth_token`) after `import ray` must make Ray read it again (Ray's own
  `authentication_token_setup._enable_token_auth` does the same). If it changes: the
  embedded Ray fails to start ("Authentication token is missing or incorrect").
- `ray._raylet.AuthenticationTokenLoader.instance().reset_cache()`: Ray's C++ side caches the
  token it first loaded, so a second run in the same process (a new token, a new embedded
  Ray) had its driver offer the first run's token and failed to connect with that same
  error (two in-process runs of the engine's tests, 2026-11-27). Ray's own test helper
  (`ray._private.authentication_test_utils.reset_auth_token_state`) does the same.
- The text of Ray's actor errors when the actor's machine is gone: Ray says so only in its
  messages, not in attributes. `ActorDiedError`: "...because its node has died..." once the
  GCS has marked the machine dead; `ActorUnavailableError`: "...temporarily unavailable..."
  when the connection to the actor closed and its raylet said nothing (a killed raylet or
  machine, seen first by the driver). If these change: a node on a lost machine is reported
  as killed by SIGKILL with no machine named (the run still ends at once).
- Ray's kills, in its words too (`death_of`): its memory monitor's ("... were killed due to
  the node running low on memory. Memory on the node (IP: ...) was ... used / ... limit
  ...\nOOM kill reason: ..."), raised as `OutOfMemoryError` by name; and the fatal line
  ("Fatal Python error: Segmentation fault") that the faulthandler Ray enables in its workers
  writes to a node's log, the one place a SIGSEGV differs from a SIGKILL. If these change: such
  a node is reported as SIGKILLed, with the kernel's log or its own as the only cause.
- The raylet's GPU check: `ray.init(num_gpus=N)` refuses to start ("Attempting to start
  raylet with N GPU, but CUDA_VISIBLE_DEVICES contains []") when the starting process's
  `CUDA_VISIBLE_DEVICES` lists fewer than N. The driver hides every GPU from itself (it must
  hold no CUDA context), so the embedded Ray is started with the plan's GPUs listed there for
  the call only (`gpus_shown_to_raylet`); each node's own env sets the variable again, and
  Ray is told to leave it. Seen on the H200 on 2026-11-27, the first GPU run of the engine. If
  it changes: a GPU run on Ray stops at its start with that ValueError.

- `ray._private.services.resolve_ip_for_localhost`: `ray.init(_node_ip_address="127.0.0.1")`
  does not keep Ray on loopback: Ray swaps a loopback address for "a remotely reachable" one,
  found by a UDP connect to 8.8.8.8:53 or, failing that, by resolving the hostname. Inside
  the run's own network namespace (`isolation`: loopback only) the first always fails, which
  Ray prints as a `network_util.cc` warning at every launch, and where the hostname resolves
  to the machine's LAN address (a cloud VM, a cluster node) the driver then waited for a GCS
  at an address the namespace does not have: five minutes of "Failed to connect to GCS"
  before a timeout killed it (reproduced here with the hostname mapped to 10.77.0.5,
  2026-11-29). The embedded Ray serves one machine, so `loopback_ray` keeps the address as
  given for the `ray.init` call. If it changes: the warning comes back and such a machine
  hangs at the start again (test_ray_engine's toy-launch test asserts the nodes' address).

- The embedded Ray's daemons: `ray.init` starts the GCS (`gcs_server`) and the raylet
  (`raylet`) as children of the driver, under those process names (`embedded_ray_daemons`),
  and its processes give up 60 s after losing the GCS (`GCS_RECONNECT_KEY`, a
  `_system_config` key: the driver's own client exits then, with a C++ error). The
  embedded Ray serves no dashboard, so its processes do not report their tasks' events to
  the GCS either (`TASK_EVENTS_KEY`, another `_system_config` key: with the reports, the
  served acting figure's Ray processes took about 0.1-0.3 ms more CPU an environment step). If the
  names or the parent change: an embedded run refuses to start with the RuntimeError below;
  if the key goes: the embedded Ray does not start (its GCS exits on a key it does not know,
  and `ray.init` times out waiting for its port file).

- `ray._private.services.canonicalize_bootstrap_address`: what `RAY_ADDRESS=auto` names (the
  cluster Ray started last on this machine), as `ray.init` resolves it, so that the entry
  point can refuse an `auto` with no cluster before the launch. It raises ConnectionError when
  none runs. If it changes: `auto` is refused at `ray.init` instead (one line, after the
  workdir is made).

- Where Ray puts its sockets, and the 107-byte limit Ray checks them against: the pure rule
  that keeps a run's Ray folder within it is `magi_lp.engines.ray_paths` (no Ray import, so
  that the SLURM script's writer can use it too).

Every function checks what it needs and raises one RuntimeError naming the attribute and the
pinned version (requirements-py312.txt).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
from collections.abc import Iterator, Sequence

import psutil

PINNED = "Ray 2.60.0 as pinned in requirements-py312.txt"

AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
"""The environment variables that carry a run's token to every process of its cluster."""


def _require(owner: object, name: str) -> None:
    if not hasattr(owner, name):
        raise RuntimeError(
            f"ray's {getattr(owner, '__name__', owner)} no longer has {name}; magi_lp "
            f"supports {PINNED} (magi_lp/engines/ray_seam.py lists what it relies on)."
        )


def use_run_token(token: str | None = None) -> str:
    """Token authentication with a token made for this run, in this process's environment
    (inherited by every process the embedded Ray starts); returns the token."""
    from ray import _raylet

    _require(_raylet, "Config")
    _require(_raylet, "AuthenticationTokenLoader")
    token = token or secrets.token_hex(16)
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = token
    _raylet.Config.initialize("")
    # The config first, then the cache (the order of Ray's own reset_auth_token_state).
    _raylet.AuthenticationTokenLoader.instance().reset_cache()
    return token


@contextlib.contextmanager
def gpus_shown_to_raylet(gpu_ids: tuple[int, ...]) -> Iterator[None]:
    """`CUDA_VISIBLE_DEVICES` lists the plan's GPUs while the embedded Ray starts, so that its
    raylet accepts `num_gpus=len(gpu_ids)`; the driver's own value comes back after. Nothing
    changes for a run with no GPUs."""
    if not gpu_ids:
        yield
        return
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def loopback_ray() -> Iterator[str]:
    """For an embedded Ray's `ray.init`: yields the node address to pass as
    `_node_ip_address`, which Ray then keeps as given instead of swapping it for the
    machine's outward address (the module's docstring says why)."""
    from ray._private import services

    _require(services, "resolve_ip_for_localhost")
    swap = services.resolve_ip_for_localhost

    def keep(host: str) -> str:
        return host if host == LOOPBACK else swap(host)

    services.resolve_ip_for_localhost = keep
    try:
        yield LOOPBACK
    finally:
        services.resolve_ip_for_localhost = swap


RAY_DAEMONS = ("gcs_server", "raylet")
"""The embedded Ray's processes a run cannot go on without."""

GCS_RECONNECT_KEY = "gcs_rpc_server_reconnect_timeout_s"
"""How long Ray's processes wait for a lost GCS before they exit (Ray's default: 60 s)."""

TASK_EVENTS_KEY = "task_events_report_interval_ms"
"""How often each Ray process reports its tasks' events to the GCS (for the dashboard and
`ray list tasks`; Ray's default: 1000 ms); 0 turns the reports off."""


def embedded_ray_daemons() -> dict[int, tuple[psutil.Process, str]]:
    """The embedded Ray's GCS and raylet, started by this driver's `ray.init`: pid ->
    (process, name)."""
    found = {}
    for process in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if (name := process.name()) in RAY_DAEMONS:
                found[process.pid] = (process, name)
    if sorted(name for _, name in found.values()) != sorted(RAY_DAEMONS):
        raise RuntimeError(
            f"ray.init started no {' and '.join(RAY_DAEMONS)} as this process's children; "
            f"magi_lp supports {PINNED} (magi_lp/engines/ray_seam.py lists what it relies on)."
        )
    return found


def daemon_running(process: psutil.Process) -> bool:
    """Whether one of `embedded_ray_daemons` still runs (a dead child is a zombie until Ray
    reaps it)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def lost_machine(error: BaseException, address: str) -> str | None:
    """Why a node's actor is gone, in words, when Ray's error says its machine (Ray node) is:
    Ray marked that node dead, or lost the connection to the actor with no word from the
    machine's raylet (what a dead machine or a killed raylet looks like from the driver).
    None when Ray reports the process's own death (its raylet saw it die)."""
    text = str(error)
    where = f" ({address})" if address else ""
    if "node has died" in text or "node was terminated" in text:
        return f"the machine it ran on{where} died: Ray marked that machine's node dead"
    if "temporarily unavailable" in text:
        return (
            f"Ray lost the connection to it and no word came from its machine{where}: "
            "that machine or Ray on it is gone, or the process itself "
            "(Ray: actor unavailable, socket closed)"
        )
    return None


# Ray's memory monitor (the raylet's, `RAY_memory_usage_threshold`) kills a worker with exit
# type NODE_OUT_OF_MEMORY; the GCS keeps the raylet's text as the actor's `oom_context`, and a
# call to the actor then raises `ray.exceptions.OutOfMemoryError` (not a RayActorError) with
# it: "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP:
# ..., ID: ...) was 1.55GB used / 23.54GB limit (0.065844)\nOOM kill reason: Memory usage ...B
# exceeded threshold of ...B (1.0% of ...B limit)\n..." (Ray 2.60, seen here with the
# threshold at 1%). The exit detail of every other death of a worker ("Worker exit type:
# SYSTEM_ERROR ... (1) the process was killed by the OOM killer ..., (3) the worker crashed
# unexpectedly due to SIGSEGV ...") lists possible causes, so it names none.
_MEMORY_MONITOR = "running low on memory"
_MEMORY_USE = re.compile(r"Memory on the node \(IP: ([^,]*),[^)]*\) was ([^\n(]*)")
_KILL_REASON = re.compile(r"OOM kill reason: ([^\n]*)")

# A Ray worker runs Python's faulthandler (`ray.init` in the worker enables it), which writes
# this line to the process's stderr (the node's log) as a fatal signal kills it; Ray's own text
# does not tell a SIGSEGV from a SIGKILL.
_FATAL_SIGNALS = {
    "Segmentation fault": signal.SIGSEGV,
    "Bus error": signal.SIGBUS,
    "Aborted": signal.SIGABRT,
    "Floating point exception": signal.SIGFPE,
    "Illegal instruction": signal.SIGILL,
}


def death_of(
    error: BaseException, address: str, log_tail: Sequence[str] = ()
) -> tuple[int, str | None]:
    """How a node's process ended when Ray's error is what the driver has: (its return code,
    Ray's reason in words or None where the node's own log says more).

    The return code is minus the signal: Ray's kills are SIGKILLs (its memory monitor's too);
    a fatal signal of the process's own (SIGSEGV, ...) is read from `log_tail`, the last lines
    of its log, where faulthandler wrote it."""
    machine = lost_machine(error, address)
    if machine is not None:
        return -signal.SIGKILL, machine
    text = str(error)
    if type(error).__name__ == "OutOfMemoryError" or _MEMORY_MONITOR in text:
        use = _MEMORY_USE.search(text)
        reason = _KILL_REASON.search(text)
        facts = "; ".join(
            fact
            for fact in (
                use and f"its machine ({use.group(1)}) had {use.group(2).strip()}",
                reason and reason.group(1).strip(),
            )
            if fact
        )
        return -signal.SIGKILL, (
            "killed by Ray's memory monitor: the machine ran low on memory"
            + (f" ({facts})" if facts else "")
            + "; give the run more memory, or raise RAY_memory_usage_threshold (0.95 of the "
            "machine's memory by default)"
        )
    for line in reversed(list(log_tail)):
        if line.startswith("Fatal Python error: "):
            sig = _FATAL_SIGNALS.get(line.removeprefix("Fatal Python error: ").strip())
            if sig is not None:
                return -sig, None  # the report names it from that line of the log
    return -signal.SIGKILL, None


def bootstrap_address(address: str) -> str | None:
    """host:port of the cluster `address` names (`auto`: the one running on this machine),
    as `ray.init` finds it; None for `local`. Raises ConnectionError where none runs."""
    from ray._private import services

    _require(services, "canonicalize_bootstrap_address")
    return services.canonicalize_bootstrap_address(address)
