"""One bash script per host that starts that host's nodes (`--launcher hosts`).

For hosts that no scheduler manages (a few workstations, cloud VMs on one private network):
run each host's script on its host, at about the same time, e.g. `ssh a1 bash
/shared/runs/x/cluster/host-a1.sh`. A script starts every node of its host in the
background, each with its launch group's env, waits for all of them and reports every node
that failed by name with its exit code; it exits 0 when all its nodes did. SIGTERM / SIGINT /
SIGHUP to the script are passed on to its nodes (which then stop as on one machine; the
coordinator's stop board stops the rest of the program).

The SLURM batch script runs the same node command, one srun step per launch group.
"""

from __future__ import annotations

import re
import shlex

from magi_lp.cluster.job import ClusterGroup, ClusterJob, common_env, header_lines


def script_name(host: str) -> str:
    """The file name of a host's script."""
    return f"host-{host}.sh"


def shell_name(launch_group: str) -> str:
    """A bash identifier for a launch group's env array ("actor@a1" -> "actor_a1_env")."""
    return re.sub(r"[^A-Za-z0-9_]", "_", launch_group) + "_env"


def env_array(group: ClusterGroup) -> list[str]:
    """The bash array holding a launch group's env (lines, quoted for the shell)."""
    lines = [f"# {group.launch_group}: {group.summary}", f"{shell_name(group.launch_group)}=("]
    lines += [f"  {shlex.quote(f'{k}={v}')}" for k, v in group.env.items()]
    lines.append(")")
    return lines


def preamble(job: ClusterJob) -> list[str]:
    """Shell lines every generated script runs first: folder, shared env, paths."""
    env = common_env(job)
    project = shlex.quote(job.paths.project_dir)
    return [
        f"cd {project} || exit 1",
        f"export PYTHONUNBUFFERED={shlex.quote(env['PYTHONUNBUFFERED'])}",
        f'export PYTHONPATH={project}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        f"PYTHON={shlex.quote(job.paths.python)}",
        f"JOB={shlex.quote(job.paths.job_dir)}",
        f"LOGS={shlex.quote(job.paths.log_dir)}",
        'mkdir -p "$LOGS"',
    ]


WAIT_FUNCTION = [
    "# wait for one background process; a trapped signal interrupts `wait` with a code > 128",
    "# while the process still runs, so wait again then.",
    "wait_for() {",
    "  local code",
    "  while :; do",
    '    wait "$1"; code=$?',
    '    if [ "$code" -gt 128 ] && kill -0 "$1" 2>/dev/null; then continue; fi',
    '    return "$code"',
    "  done",
    "}",
    "describe() {  # an exit status in words",
    '  if [ "$1" -gt 128 ]; then echo "killed by signal $(kill -l $(($1 - 128)) 2>/dev/null)'
    ' ($(($1 - 128)))"; else echo "exit code $1"; fi',
    "}",
]


def shell_node_command(launch_group: str, task_selector: list[str]) -> str:
    """The node command as a shell line using $PYTHON and $JOB (see `node_command`)."""
    selector = " ".join(shlex.quote(a) for a in task_selector)
    return (
        f'"$PYTHON" -m magi_lp.cluster.host_node --job "$JOB" '
        f"--group {shlex.quote(launch_group)} {selector}"
    )


def _command(group: ClusterGroup, task: int) -> str:
    return shell_node_command(group.launch_group, ["--task", str(task)]) + ' --log_dir "$LOGS"'


def starter(function: str, usage: str, command: str) -> list[str]:
    """The wait function and a bash function `function` that runs `command "$@"` in the
    background, recording its pid and name (the per-host scripts' `start`, SLURM's `step`)."""
    return [
        *WAIT_FUNCTION,
        "",
        "pids=()",
        "names=()",
        f"{function}() {{  # {function} {usage}",
        "  local name=$1; shift",
        f'  {command} "$@" &',
        "  pids+=($!)",
        '  names+=("$name")',
        "}",
    ]


def render_host_script(job: ClusterJob, host: str) -> str:
    """The script of one host."""
    address = job.host(host).address
    groups = job.groups_on(host)
    nodes = [n for g in groups for n in g.nodes]
    lines = ["#!/usr/bin/env bash"]
    lines += [f"# {line}".rstrip() for line in header_lines(job, f"Host {host} ({address})")]
    lines += [
        "#",
        f"# Run this on host {host} ({address}); every host's script must run for the program",
        f"# to start. It starts {len(nodes)} node(s) and exits 1 if any of them failed.",
        "set -u",
        *preamble(job),
        "",
    ]
    for group in groups:
        lines += env_array(group)
    lines += [
        "",
        *starter("start", "NAME VAR=VALUE... COMMAND...: one node in the background", "env"),
        "trap 'kill -TERM \"${pids[@]}\" 2>/dev/null' TERM INT HUP",
        "",
    ]
    for group in groups:
        for node in group.nodes:
            env = f'"${{{shell_name(group.launch_group)}[@]}}"'
            lines.append(f"start {shlex.quote(node.name)} {env} {_command(group, node.task)}")
    lines += [
        f'echo "magi_lp host {host}: started ${{#pids[@]}} nodes; their logs:'
        f' $LOGS/<group>/<task>" >&2',
        "",
        "status=0",
        'for i in "${!pids[@]}"; do',
        '  wait_for "${pids[$i]}"; code=$?',
        '  if [ "$code" -ne 0 ]; then',
        f'    echo "magi_lp host {host}: node ${{names[$i]}} failed: $(describe "$code");'
        ' its log: $LOGS/${names[$i]}" >&2',
        "    status=1",
        "  fi",
        "done",
        f'echo "magi_lp host {host}: all ${{#pids[@]}} nodes ended; exit code $status" >&2',
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


def render_host_scripts(job: ClusterJob) -> dict[str, str]:
    """File name -> script, for every host that runs nodes."""
    return {
        script_name(h.name): render_host_script(job, h.name)
        for h in job.hosts
        if job.groups_on(h.name)
    }
