"""Tests for magi_lp.launch.isolation: node ports unreachable from outside, loopback works.

The integration tests start tests/isolation_program.py (a ReverbNode and two CourierNodes) and
connect to every TCP port its processes listen on from a separate network namespace made here
(`ip netns add`, a veth pair in 198.18.0.0/15). Traffic goes only to loopback and to the
addresses of that veth pair, which is removed afterwards.
"""

import contextlib
import errno
import fcntl
import ipaddress
import json
import os
import pty
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import termios
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from magi_lp.errors import ConfigError
from magi_lp.launch import isolation, processes
from tests import net_probe

REPO = Path(__file__).resolve().parent.parent
PROGRAM = REPO / "tests" / "isolation_program.py"
PROBE = REPO / "tests" / "isolation_probe.py"
NOBODY = 65534

SUPPORT = isolation.probe()
needs_netns = pytest.mark.skipif(
    not SUPPORT.available, reason=f"cannot create network namespaces here: {SUPPORT.reason}"
)
needs_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="the probe namespace and its veth pair need root (CAP_NET_ADMIN on the host)",
)

# Run with `python -c CHILD mode [exit code]`: isolates itself, then reports what it sees.
CHILD = textwrap.dedent(
    """
    import json, os, signal, socket, sys, time
    sys.path.insert(0, {repo!r})
    from magi_lp.launch import isolation
    try:
        from tests.net_probe import describe_exposure
    except ImportError:  # a Python without psutil (the uid-nobody test's): exposure unchecked
        describe_exposure = lambda: None
    code = isolation.run_isolated_if_needed(sys.argv[1], sys.argv)
    if code is not None:
        sys.exit(code)
    assert isolation.run_isolated_if_needed(sys.argv[1], sys.argv) is None  # no second level
    server = socket.socket(socket.AF_INET6)
    server.bind(("::", 0))
    server.listen()
    socket.create_connection(("localhost", server.getsockname()[1]), timeout=2).close()
    caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
    print(json.dumps({{
        "netns": os.readlink("/proc/self/ns/net"),
        "interfaces": [name for _, name in socket.if_nameindex()],
        "isolated": isolation.is_isolated(),
        "uid": os.getuid(),
        "cap_eff": caps,
        "exposure": describe_exposure(),
    }}), flush=True)
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    """
).format(repo=str(REPO))

# Counts SIGINT / SIGTERM after isolating itself: exits with 10 + how many arrived in the
# 0.5 s after the first (or in 2 s when none comes). With "own-group" it first leaves the
# outer process's group, and so the terminal's foreground group.
SIGNAL_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    sys.path.insert(0, {repo!r})
    from magi_lp.launch import isolation
    code = isolation.run_isolated_if_needed("required", sys.argv)
    if code is not None:
        sys.exit(code)
    if "own-group" in sys.argv:
        os.setpgid(0, 0)
    watched = {{signal.SIGINT, signal.SIGTERM}}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    print("ready", flush=True)
    received = []
    deadline = time.monotonic() + 2.0
    while (left := deadline - time.monotonic()) > 0:
        info = signal.sigtimedwait(watched, left)
        if info is not None:
            received.append(info)
            deadline = min(deadline, time.monotonic() + 0.5)
    sys.exit(10 + len(received))
    """
).format(repo=str(REPO))


def _run_child(code: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=30, **kwargs
    )


# --- modes and messages ----------------------------------------------------------------------


def test_bad_mode_is_config_error():
    with pytest.raises(ConfigError, match=r"isolation must be .*, got 'maybe'"):
        isolation.run_isolated_if_needed("maybe", ["prog"])
    with pytest.raises(ConfigError, match="isolation"):
        isolation.describe("on")


def test_off_goes_on_and_says_what_is_exposed(capsys):
    assert isolation.run_isolated_if_needed("off", ["prog"]) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "Courier, Reverb" in err[0] and "all interfaces" in err[0]
    assert isolation.describe("off").startswith("isolated: no")


@pytest.mark.parametrize("stack", ["launchpad", "ray"])
def test_off_says_what_each_engine_exposes(capsys, stack):
    """Ray's run printed Launchpad's warning about Courier and Reverb: its embedded Ray serves
    on loopback only, behind the run's token (test_ray_engine reads its sockets)."""
    from magi_lp.engines import REGISTRY

    transports = {e.transport for e in REGISTRY.values() if e.stack == stack and e.selectable}
    for transport in sorted(transports):
        assert isolation.run_isolated_if_needed("off", ["prog"], transport) is None
        (said,) = capsys.readouterr().err.strip().splitlines()
        planned = isolation.describe("off", transport)
        if stack == "launchpad":
            assert "Courier, Reverb" in said and "all interfaces" in said
            assert "Courier, Reverb" in planned
        else:
            assert "Courier" not in said and "Reverb" not in said
            assert "Ray's ports listen on this machine's loopback only" in said
            assert "behind a token made for the run" in planned


@pytest.fixture
def namespaces_refused(monkeypatch):
    """Makes the namespace set-up fail as on a kernel without unprivileged user namespaces."""

    def refuse(libc, attempts, maps):
        raise OSError(
            errno.EPERM,
            "unshare(CLONE_NEWUSER|CLONE_NEWNET): EPERM Operation not permitted "
            "(kernel.unprivileged_userns_clone=0)",
        )

    monkeypatch.setattr(isolation, "_unshare", refuse)
    # Were the patch ever bypassed, the child would be this, not a second pytest.
    monkeypatch.setattr(
        isolation, "_reexec_command", lambda argv: [sys.executable, "-c", "raise SystemExit(99)"]
    )
    monkeypatch.delenv(isolation.MARKER_ENV, raising=False)


def test_auto_without_namespaces_goes_on_with_one_line(namespaces_refused, capsys):
    mask_before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert isolation.run_isolated_if_needed("auto", ["prog"]) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "isolation unavailable" in err[0] and "unprivileged_userns_clone=0" in err[0]
    assert isolation.describe("auto").startswith("isolated: no: unshare(")
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask_before  # nothing left blocked


def test_required_without_namespaces_names_isolation_and_the_fix(namespaces_refused):
    with pytest.raises(ConfigError) as raised:
        isolation.run_isolated_if_needed("required", ["prog"])
    message = str(raised.value)
    assert "isolation=required" in message and "EPERM" in message
    for fix in ("kernel.unprivileged_userns_clone=1", "root", "isolation=off"):
        assert fix in message
    assert "will refuse" in isolation.describe("required")


@pytest.mark.parametrize(
    "orig_argv, argv, expected",
    [
        (
            ["py", "-u", "-m", "pkg.lp_main", "--x=1"],
            ["/r/pkg/lp_main.py", "--x=1"],
            ["-u", "-m", "pkg.lp_main", "--x=1"],
        ),
        (["py", "run.py", "--x=1"], ["run.py", "--x=1"], ["run.py", "--x=1"]),
        (["py", "-c", "code", "a"], ["-c", "a"], ["-c", "code", "a"]),
    ],
)
def test_reexec_keeps_interpreter_options_and_module(monkeypatch, orig_argv, argv, expected):
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    monkeypatch.setattr(sys, "argv", argv)
    assert isolation._reexec_command(argv) == [sys.executable, *expected]


# --- the isolated child ----------------------------------------------------------------------


@needs_netns
def test_child_runs_in_a_loopback_only_namespace_and_its_exit_code_comes_back():
    outer = _run_child(CHILD, "required", "7")
    assert outer.returncode == 7, outer.stderr
    seen = json.loads(outer.stdout)
    assert seen["netns"] != os.readlink("/proc/self/ns/net")
    assert seen["interfaces"] == ["lo"]
    assert seen["isolated"] is True
    assert seen["exposure"].startswith("no node port is reachable")
    assert "isolated: node ports are reachable over loopback only" in outer.stderr
    assert isolation.describe("required").startswith("isolated: yes")


@needs_netns
def test_a_stale_marker_does_not_switch_isolation_off(monkeypatch):
    # The marker names the namespace this process is in, as in a shell that copied it.
    marker = os.readlink("/proc/self/ns/net")
    monkeypatch.setenv(isolation.MARKER_ENV, marker)
    assert not isolation.is_isolated()
    outer = _run_child(CHILD, "required", env={**os.environ, isolation.MARKER_ENV: marker})
    assert outer.returncode == 0, outer.stderr
    assert json.loads(outer.stdout)["interfaces"] == ["lo"]


@needs_netns
def test_child_killed_by_a_signal_gives_128_plus_signal():
    code = CHILD.replace("sys.exit(int(", "os.kill(os.getpid(), signal.SIGKILL); sys.exit(int(")
    assert _run_child(code, "required").returncode == 128 + signal.SIGKILL


# Isolates itself, makes a run temp folder (as a launcher does) and starts a process that
# outlives it (as Ray's agents outlived a SIGKILLed driver), then SIGKILLs itself.
KILLED_CHILD = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    sys.path.insert(0, {repo!r})
    from magi_lp.launch import isolation, run_folders
    code = isolation.run_isolated_if_needed("required", sys.argv)
    if code is not None:
        sys.exit(code)
    run_folders.make_run_temp()
    orphan = subprocess.Popen(
        ["sleep", "120"], start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    print(orphan.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
).format(repo=str(REPO))


@needs_netns
def test_a_killed_run_leaves_no_process_and_no_temp_folder(tmp_path):
    """The isolated program SIGKILLed (by hand, the OOM killer): the isolation parent ends what
    it left in its namespace, removes its temp folder and says so in one line. Seen before:
    Ray's dashboard and runtime-env agents outlived a SIGKILLed driver by minutes and its Ray
    folder stayed in /tmp; Launchpad's job folder stayed until the next launch."""
    outer = _run_child(KILLED_CHILD, env={**os.environ, "TMPDIR": str(tmp_path)})
    orphan = int(outer.stdout.split()[0])
    try:
        assert outer.returncode == 128 + signal.SIGKILL, outer.stderr
        assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == "zombie"
        assert list(tmp_path.iterdir()) == []
        (line,) = [x for x in outer.stderr.splitlines() if "was killed by" in x]
        assert "was killed by SIGKILL; ended the process it left (sleep); " in line, line
        assert "removed the temp folder of killed runs (" in line and line.endswith(
            "; the same command resumes from the workdir's newest checkpoint, if it has one"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(orphan, signal.SIGKILL)


@needs_netns
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_sent_to_the_outer_process_reach_the_child_once(signum):
    outer = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_CHILD], stdout=subprocess.PIPE, text=True
    )
    try:
        assert outer.stdout.readline().strip() == "ready"
        outer.send_signal(signum)
        assert outer.wait(timeout=10) == 11
    finally:
        processes.kill_tree(outer.pid)


@needs_netns
@pytest.mark.parametrize("child_group", ["same-group", "own-group"])
def test_terminal_ctrl_c_reaches_the_child_once(child_group):
    """The terminal signals its foreground process group. A child still in it gets the signal
    from the terminal; one that left it gets the outer process's copy."""
    master, slave = pty.openpty()
    outer = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_CHILD, child_group],
        stdin=slave,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    os.close(slave)
    try:
        assert outer.stdout.readline().strip() == "ready"
        os.write(master, b"\x03")
        assert outer.wait(timeout=10) == 11
    finally:
        os.close(master)
        processes.kill_tree(outer.pid)


def test_terminal_signals_are_not_forwarded_to_a_child_in_the_same_group():
    """Launchpad takes a second Ctrl-C as "kill everything now", so the outer process must not
    add its copy to the terminal's. (Two copies of a signal can merge in the receiver, which is
    why this is checked on the decision rather than by counting.)"""

    class Info:
        def __init__(self, signo: int, code: int):
            self.si_signo, self.si_code = signo, code

    kernel, user = 0x80, 0  # SI_KERNEL (a terminal), SI_USER (kill)
    same_group = os.getpid()  # trivially in this process group
    with subprocess.Popen(["sleep", "5"], start_new_session=True) as other:
        try:
            assert not isolation._should_forward(Info(signal.SIGINT, kernel), same_group)
            assert not isolation._should_forward(Info(signal.SIGQUIT, kernel), same_group)
            assert isolation._should_forward(Info(signal.SIGINT, kernel), other.pid)
            assert isolation._should_forward(Info(signal.SIGINT, user), same_group)
            assert isolation._should_forward(Info(signal.SIGTERM, kernel), same_group)
            assert not isolation._should_forward(Info(signal.SIGCHLD, kernel), same_group)
        finally:
            other.kill()


@needs_netns
def test_child_gets_sigterm_when_the_outer_process_is_killed(tmp_path):
    report = tmp_path / "got_sigterm"
    code = SIGNAL_CHILD.replace(
        "sys.exit(10 + len(received))", f"open({str(report)!r}, 'w').write(str(len(received)))"
    )
    assert code != SIGNAL_CHILD
    outer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert outer.stdout.readline().strip() == "ready"
        outer.kill()  # SIGKILL cannot be forwarded; the parent-death signal stands in
        outer.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert report.read_text() == "1"
    finally:
        processes.kill_tree(outer.pid)


def _nobody_python() -> str | None:
    """A Python >= 3.10 that uid `nobody` can run (the venv's may live under /root)."""
    for candidate in (sys.executable, shutil.which("python3") or "", "/usr/bin/python3"):
        if not candidate:
            continue
        try:
            check = subprocess.run(
                [candidate, "-c", "import sys; assert sys.version_info >= (3, 10)"],
                user=NOBODY,
                group=NOBODY,
                extra_groups=[],
                capture_output=True,
            )
        except OSError:
            continue
        if check.returncode == 0:
            return candidate
    return None


@needs_root
def test_ordinary_user_gets_a_user_namespace_keeping_its_uid_and_no_capabilities(tmp_path):
    python = _nobody_python()
    if python is None:
        pytest.skip("no Python >= 3.10 that uid nobody can run")
    outer = subprocess.run(
        [python, "-c", CHILD, "required", "5"],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if "cannot be made" in outer.stderr:
        pytest.skip(f"unprivileged user namespaces are off here: {outer.stderr.strip()}")
    assert outer.returncode == 5, outer.stderr
    seen = json.loads(outer.stdout)
    assert seen["interfaces"] == ["lo"]
    assert seen["uid"] == NOBODY  # mapped to itself, not to root
    assert int(seen["cap_eff"], 16) == 0  # the set-up's capabilities end at exec
    assert "user+net namespace" in outer.stderr


@needs_root
def test_an_ordinary_users_killed_run_leaves_no_process_and_no_temp_folder():
    """The clean-up after a SIGKILLed run, as uid nobody (a user namespace): the parent sees
    and ends the processes left in the run's namespace, and removes its temp folder."""
    python = _nobody_python()
    if python is None:
        pytest.skip("no Python >= 3.10 that uid nobody can run")
    temp = Path(tempfile.mkdtemp(prefix="magi_lp_nobody_", dir="/tmp"))
    try:
        temp.chmod(0o777)
        outer = subprocess.run(
            [python, "-c", KILLED_CHILD],
            user=NOBODY,
            group=NOBODY,
            extra_groups=[],
            cwd=temp,
            env={"PATH": os.environ["PATH"], "TMPDIR": str(temp)},
            capture_output=True,
            text=True,
            timeout=30,
        )
        if "cannot be made" in outer.stderr:
            pytest.skip(f"unprivileged user namespaces are off here: {outer.stderr.strip()}")
        orphan = int(outer.stdout.split()[0])
        try:
            assert outer.returncode == 128 + signal.SIGKILL, outer.stderr
            assert "user+net namespace" in outer.stderr
            assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == "zombie"
            assert "ended the process it left (sleep)" in outer.stderr, outer.stderr
            assert list(temp.iterdir()) == []
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, signal.SIGKILL)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def test_listening_sockets_reads_addresses_and_exposure():
    loop = socket.socket(socket.AF_INET)
    loop.bind(("127.0.0.1", 0))
    loop.listen()
    anywhere = socket.socket(socket.AF_INET6)
    anywhere.bind(("::", 0))
    anywhere.listen()
    with loop, anywhere:
        found = {s.port: s for s in net_probe.listening_sockets()}
        host_has_network = net_probe.has_non_loopback_interface(os.getpid())
        assert found[loop.getsockname()[1]].address == "127.0.0.1"
        assert not found[loop.getsockname()[1]].exposed
        assert found[anywhere.getsockname()[1]].address == "::"
        assert found[anywhere.getsockname()[1]].exposed == host_has_network


# --- a real Launchpad program ----------------------------------------------------------------


def _free_pair(seed: int) -> tuple[str, str]:
    """The two addresses of a /30 of 198.18.0.0/15 that overlaps no network of this machine's
    interfaces, the `seed`th one on: a pair on the host's own network could be its address or
    its gateway's (this machine's eth0 is 192.0.2.2/24, its gateway 192.0.2.1: the earlier
    pick from 192.0.2.0/24 by pid made exactly that pair for one pid in 63)."""
    taken = [
        ipaddress.ip_interface(f"{a.address}/{a.netmask}").network
        for addresses in psutil.net_if_addrs().values()
        for a in addresses
        if a.family == socket.AF_INET and a.netmask
    ]
    subnets = list(ipaddress.ip_network("198.18.0.0/15").subnets(new_prefix=30))
    for i in range(len(subnets)):
        net = subnets[(seed + i) % len(subnets)]
        if not any(net.overlaps(t) for t in taken):
            host_ip, ns_ip = net.hosts()
            return str(host_ip), str(ns_ip)
    pytest.skip("every /30 of 198.18.0.0/15 is on a network of this machine")


@pytest.fixture
def probe_namespace():
    """A network namespace joined to this one by a veth pair; yields (ns, host_ip, ns_ip).

    Addresses are a /30 of 198.18.0.0/15 (the benchmarking range) picked from the pid, so runs
    in parallel do not collide, and on no network this machine's interfaces are on
    (`_free_pair`). Everything is removed afterwards, also on failure.
    """
    if os.geteuid() != 0:
        pytest.skip("the probe namespace and its veth pair need root (CAP_NET_ADMIN)")
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is needed to make the probe namespace")
    tag = os.getpid() % 100000
    ns, host_if, ns_if = f"magi-iso-{tag}", f"mgiso{tag}h", f"mgiso{tag}p"
    host_ip, ns_ip = _free_pair(os.getpid())
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
        ["ip", "link", "set", ns_if, "netns", ns],
        ["ip", "addr", "add", f"{host_ip}/30", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "-n", ns, "addr", "add", f"{ns_ip}/30", "dev", ns_if],
        ["ip", "-n", ns, "link", "set", ns_if, "up"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
    ]
    try:
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"cannot create the probe namespace: {' '.join(step)}: {done.stderr}")
        yield ns, host_ip, ns_ip
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _probe_from(ns: str, host: str, ports: list[int]) -> dict[int, str]:
    done = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, str(PROBE), host, *map(str, ports)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return {int(port): outcome for port, outcome in json.loads(done.stdout).items()}


class Program:
    """tests/isolation_program.py running in the background, torn down however a test ends."""

    def __init__(self, workdir: Path, mode: str, wrapper: list[str], terminal: bool):
        """With `terminal`, the program runs in a new session whose controlling terminal is a
        pty; `press_ctrl_c` types into it."""
        self.workdir = workdir
        self.log = open(workdir / "launcher.log", "w")  # noqa: SIM115  (closed in stop())
        self.terminal = None
        tty_options = {}
        if terminal:
            self.terminal, tty = pty.openpty()
            tty_options = dict(
                stdin=tty,
                start_new_session=True,
                preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
            )
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, str(PROGRAM), "--isolation", mode, "--workdir", workdir],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            **tty_options,
        )
        if terminal:
            os.close(tty)
        self.pids: set[int] = {self.proc.pid}

    def press_ctrl_c(self) -> None:
        os.write(self.terminal, b"\x03")

    def wait_ready(self, timeout_s: float = 150.0) -> dict:
        """Waits for the prober's report; by then every node's server is up."""
        ready = self.workdir / "ready.json"
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"program not ready (exit {self.proc.poll()}):\n{self.output()}")
            time.sleep(0.2)
        self.pids |= {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        return json.loads(ready.read_text())

    def output(self) -> str:
        self.log.flush()
        text = (self.workdir / "launcher.log").read_text()
        for node_log in sorted((self.workdir / "logs").glob("*/*")):
            text += f"\n--- {node_log}:\n" + node_log.read_text()[-3000:]
        return text

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        for pid in self.pids:
            processes.kill_tree(pid)
        self.proc.wait()
        self.log.close()
        if self.terminal is not None:
            os.close(self.terminal)

    def leftovers(self) -> list[int]:
        alive = []
        for pid in self.pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
        return alive


@pytest.fixture
def start_program(tmp_path):
    started = []

    def start(mode: str, wrapper: tuple[str, ...] = (), terminal: bool = False) -> Program:
        program = Program(tmp_path, mode, list(wrapper), terminal)
        started.append(program)
        return program

    yield start
    for program in started:
        program.stop()


# Root takes the plain net namespace. Root without CAP_SYS_ADMIN (as in a container) falls
# back to a user namespace, the path an ordinary user takes (the venv's Python may not be
# runnable by another uid); it keeps CAP_SETFCAP, which mapping uid 0 needs.
AS_CONTAINER_ROOT = ("setpriv", "--inh-caps=-all", "--bounding-set=-all,+setfcap", "--")
RUNS = {
    "isolated": ("required", (), "net namespace"),
    "isolated-userns": ("required", AS_CONTAINER_ROOT, "user+net namespace"),
    "off": ("off", (), None),
}


@pytest.mark.integration
@pytest.mark.timeout(240)
@pytest.mark.parametrize("run", list(RUNS))
def test_node_ports_unreachable_from_the_network(run, probe_namespace, start_program):
    mode, wrapper, method = RUNS[run]
    if mode != "off" and not SUPPORT.available:
        pytest.skip(f"cannot create network namespaces here: {SUPPORT.reason}")
    if wrapper and (os.geteuid() != 0 or shutil.which(wrapper[0]) is None):
        pytest.skip(f"dropping capabilities needs root and util-linux {wrapper[0]}")
    ns, host_ip, _ = probe_namespace
    # A listener of our own on the host side proves the probe path works at all.
    control = socket.socket(socket.AF_INET)
    control.bind((host_ip, 0))
    control.listen()
    control_port = control.getsockname()[1]

    program = start_program(mode, wrapper)
    program.wait_ready()
    sockets = net_probe.listening_sockets(program.proc.pid)
    ports = sorted({s.port for s in sockets})
    assert len(ports) >= 3, f"expected Reverb + 2 Courier ports, found {sockets}"
    outcomes = _probe_from(ns, host_ip, [control_port, *ports])
    control.close()
    assert outcomes.pop(control_port) == "reached"

    if mode == "off":
        assert all(s.exposed for s in sockets), sockets
        assert outcomes == dict.fromkeys(ports, "reached"), outcomes
    else:
        assert method in program.output()
        assert not any(s.exposed for s in sockets), sockets
        # A port number that some unrelated host process also listens on would be answered by
        # that process, not by a node; leave it out rather than report it as a leak.
        host_ports = {port for _, port in net_probe.tcp_listeners(os.getpid()).values()}
        probed = {p: o for p, o in outcomes.items() if p not in host_ports}
        assert len(probed) >= 3
        assert set(probed.values()) == {"refused"}, outcomes

    (program.workdir / "stop").touch()
    assert program.proc.wait(timeout=30) == 0, program.output()
    assert program.leftovers() == []
    print(f"{run}: {len(outcomes)} node ports probed from {ns}: {outcomes}")


@pytest.mark.integration
@pytest.mark.timeout(240)
@needs_netns
@pytest.mark.parametrize("stop_by", ["sigterm", "ctrl-c"])
def test_isolated_nodes_talk_over_loopback_and_stop_cleanly(stop_by, start_program):
    program = start_program("required", terminal=stop_by == "ctrl-c")
    report = program.wait_ready()
    assert report["echo"] == 42  # prober -> echo Courier call
    assert report["sample"] == 7  # prober -> Reverb insert + sample
    exposure = net_probe.describe_exposure(program.proc.pid)
    assert exposure.startswith("no node port is reachable"), exposure

    if stop_by == "sigterm":
        program.proc.send_signal(signal.SIGTERM)  # forwarded to the isolated launcher
    else:
        program.press_ctrl_c()  # the terminal signals the launcher itself, and the nodes
    assert program.proc.wait(timeout=30) == 0, program.output()
    # A plain stop: not "asked again to stop: killing ..." (a doubled Ctrl-C) nor a timeout.
    assert "killing" not in (program.workdir / "launcher.log").read_text(), program.output()
    time.sleep(0.2)
    assert program.leftovers() == []
