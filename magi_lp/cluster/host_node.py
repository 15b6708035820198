"""One node of a multi-host program, started on its host by the engine.

    python -m magi_lp.cluster.host_node --job <job_dir> --group <launch group> --task N
    python -m magi_lp.cluster.host_node --job <job_dir> --group <launch group> \\
        --task_var SLURM_PROCID [--task_offset K]     # the engine numbers the tasks

This is Launchpad's `process_entry` (load the launch group's pickled node functions, make
the process's WorkerManager, run function N) plus what a node needs without a local
launcher (see `magi_lp.cluster.stop_board`):
- the coordinator's process serves the stop board; every other node polls it from a
  thread and stops when told, or when the coordinator is gone;
- with `--log_dir`, stdout and stderr go to `<log_dir>/<group>/<task>`, as on one machine,
  and an earlier launch's log there is kept as `<task>.<n>` (`run_folders.keep_earlier_log`);
- the node exits with 0 when it ended normally or was told to stop, 1 when it raised (the
  traceback is in its log), and the coordinator with the stop's exit code (1: a node died,
  failed at its stop or overstayed its notice); the engine (srun, the Kubernetes Job, the
  host script) collects these codes;
- the node gets SIGTERM if the process that started it dies (Linux), and kills any process
  it started before it exits;
- SIGTERM (an engine stopping the job: `scancel`, a time limit, preemption) starts the
  program's tiered stop through the coordinator rather than ending this node at once, so
  the learner's final save still finds the counter;
- the node runs with a private temp folder (TMPDIR and `tempfile.tempdir`), removed before it
  exits: it leaves with `os._exit`, which skips TensorFlow's removal of its autograph files
  (each TD3 run on the test's SLURM cluster left 12 in the host's /tmp), here or from inside
  the node (`node_lifetime.leave_process`, which removes the folder first: each node that left
  that way had left its folder). A node killed with SIGKILL leaves its folder, which the
  next node or run on that host removes.

The environment (the placement plan's env for the group) is set by whoever starts the
command; this module reads the node's identity from the job's manifest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, NoReturn

from magi_lp.launch import processes


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="magi_lp.cluster.host_node", description=__doc__)
    parser.add_argument("--job", required=True, help="the job folder (holds manifest.json)")
    parser.add_argument("--group", required=True, help="the node's launch group")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--task", type=int, help="the node's task id in its launch group")
    which.add_argument("--task_var", help="an environment variable holding the task number")
    parser.add_argument("--task_offset", type=int, default=0, help="added to --task_var's value")
    parser.add_argument("--log_dir", default="", help="write stdout/stderr to LOG_DIR/GROUP/TASK")
    return parser.parse_args(argv)


def _fail(message: str) -> NoReturn:
    from magi_lp import console

    console.error(f"magi_lp.cluster.host_node: {message}")
    sys.exit(2)


def _task(args: argparse.Namespace) -> int:
    if args.task_var is None:
        return args.task
    value = os.environ.get(args.task_var, "")
    if not value.strip().isdigit():
        _fail(f"--task_var {args.task_var}: the variable is {value!r}, not a task number")
    return int(value) + args.task_offset


def _redirect_output(path: Path) -> None:
    from magi_lp.launch.run_folders import keep_earlier_log

    path.parent.mkdir(parents=True, exist_ok=True)
    keep_earlier_log(path)  # a resubmitted job's nodes keep the earlier launch's logs
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _die_with_parent() -> None:
    # The host script or srun step that started this node is gone: so is the node.
    if os.getppid() == 1 or not sys.platform.startswith("linux"):
        return
    processes.die_with_parent(signal.SIGTERM)


def _say(text: str) -> None:
    from magi_lp import console

    console.say(text, source="node")


def main(argv: list[str] | None = None) -> None:
    """Runs one node; never returns (exits with the node's code)."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    job_dir = Path(args.job)
    try:
        manifest = json.loads((job_dir / "manifest.json").read_text())
    except (OSError, ValueError) as error:
        _fail(f"cannot read {job_dir / 'manifest.json'} ({error}); prepare the job first")
    group = manifest["groups"].get(args.group)
    if group is None:
        _fail(f"--group {args.group}: the job has {sorted(manifest['groups'])}")
    task = _task(args)
    if not 0 <= task < len(group["nodes"]):
        _fail(f"task {task} of {args.group}: the group has {len(group['nodes'])} node(s)")
    name = group["nodes"][task]
    if args.log_dir:
        _redirect_output(Path(args.log_dir) / args.group / str(task))
    _die_with_parent()
    from magi_lp.launch import run_folders

    with run_folders.private_temp():
        code = _run_node(manifest, job_dir, args.group, task, name)
    sys.stdout.flush()
    sys.stderr.flush()
    processes.end_children()  # best effort: nothing of ours should be left
    os._exit(code)


def _run_node(manifest: dict[str, Any], job_dir: Path, group: str, task: int, name: str) -> int:
    from magi_lp.cluster.job import AddressRef, StopSettings
    from magi_lp.cluster.stop_board import StopBoard, StopWatcher, install, say_left, serve

    settings = StopSettings(**manifest["stop"])
    control = manifest["control"]
    control_ref = AddressRef(control["host"], control["host_var"])
    coordinator = name == manifest["coordinator"]
    _say(
        f"node {name} (host {manifest['nodes'][name]['host']}, pid {os.getpid()}) starting; "
        f"ports {manifest['nodes'][name]['ports']}"
    )

    # Launchpad's flags (termination notice, signal handling) must be parsed before its
    # WorkerManager reads them; the node's own arguments are not absl flags.
    from magi_lp.launch.launchpad_seam import node_worker_manager

    manager = node_worker_manager("magi_lp.cluster.host_node", settings.notice_seconds)
    sys.path.append(os.getcwd())  # as process_entry: the project is importable from here
    stop_event = manager.stop_event()

    board = server = address = None
    if coordinator:
        tiers = {n: v["tier"] for n, v in manifest["nodes"].items() if n != name}
        board = StopBoard(tiers, settings, on_stop=stop_event.set, report=_say)
        server = serve(board, control["port"])
        threading.Thread(target=board.run_monitor, name="magi_lp-stop-board", daemon=True).start()
    else:
        address = control_ref.resolve(control["port"])
        # Overstaying the notice, it leaves as a node does (children, private temp, os._exit).
        from magi_lp.launch.node_lifetime import leave_process

        StopWatcher(name, address, settings, stop_event, report=_say, exit=leave_process).start()
    install(board, name)
    _stop_in_tiers_on_sigterm(board, name, control_ref, control["port"], stop_event)

    import cloudpickle

    with open(job_dir / manifest["groups"][group]["pickle"], "rb") as handle:
        functions = cloudpickle.load(handle)
    code = 0
    try:
        functions[task]()
    except BaseException:  # the node's failure: its traceback goes to its log
        traceback.print_exc()
        code = 1
    if address is not None:  # its tier need not wait out its silence; a failure stops at once
        say_left(address, name, code)
    if board is not None:
        board.coordinator_ended(name, code)
        board.wait_done()
        server.Stop()
        if board.failed:
            _say(f"the program stopped because of a failure: {board.cause}")
            code = 1
    _say(f"node {name} exits with code {code}")
    return code


def _stop_in_tiers_on_sigterm(
    board: Any, name: str, control: Any, port: int, stop_event: threading.Event
) -> None:
    """SIGTERM starts the program's tiered stop instead of stopping this node at once.

    An engine stops a job by sending SIGTERM to every node at the same moment (`scancel`, a
    SLURM time limit or preemption, `kubectl delete`). Launchpad's own handler would stop
    each node right away, so the counter and the replay would be gone before the learner's
    final save (which then has no step counts). Instead the coordinator begins the stop and
    every other node asks it to, then goes on until the board tells its tier to stop, as
    at the step limit. A node that cannot reach the coordinator stops at once.
    """
    asked = threading.Event()

    def stop() -> None:
        if board is not None:
            board.begin_stop("SIGTERM: the engine stops the job (scancel, time limit, ...)")
            return
        try:
            import courier

            client = courier.Client(control.resolve(port), call_timeout=5.0)
            client.request_stop(name, "SIGTERM from the engine (scancel, time limit, ...)")
            _say(f"node {name}: SIGTERM; asked the coordinator to stop the program in tiers")
        except Exception as error:  # no coordinator to follow: stop alone
            _say(f"node {name}: SIGTERM and no coordinator ({type(error).__name__}); stopping")
            stop_event.set()

    def on_sigterm(signum: int, frame: Any) -> None:
        del signum, frame
        if not asked.is_set():
            asked.set()
            # Not here: the main thread may hold the board's lock when the signal arrives.
            threading.Thread(target=stop, name="magi_lp-sigterm", daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)


if __name__ == "__main__":
    main()
