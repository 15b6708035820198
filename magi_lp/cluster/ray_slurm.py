"""The SLURM batch script of a Ray cluster inside the job (`--launcher slurm`, current stack).

Shape of the script:
- one component of a heterogeneous job per machine of the plan, as Launchpad's script has
  (`--nodes=1 --exclusive`, `--gres=gpu:N`, `--nodelist` for a pinned machine), with one
  task each: the machine's Ray node;
- the machines' addresses from the allocation (NodeAddr, or the name plus
  `hosts.slurm.address_suffix`; a name is resolved to its IPv4 address, which `ray start
  --node-ip-address` needs) as MAGI_LP_HOST_<HOST>;
- a token made in the script for this job (`RAY_AUTH_MODE=token`, `RAY_AUTH_TOKEN`), in the
  environment of the job's processes only (srun passes it on): never written to a file;
- `ray start --head` on the first machine (the coordinator's; the script runs there) with every
  port fixed
  inside the machine's range (`ray_cluster.RayPorts`), then, once its GCS answers, `ray start
  --address` on the others, one `srun --whole` step per machine, each offering its machine's
  custom resource (`--resources`) and run by `magi_lp.cluster.ray_node`, which keeps Ray up
  through the job's SIGTERM until the driver is done and then ends it with nothing left;
- the driver: the entry point with `--launcher ray` and RAY_ADDRESS set, in the background;
  its output is the job's output. GCS health checks are made faster (a dead machine is
  noticed in about 5 s, not Ray's default 15 s or more);
- the script waits for the driver, says at once when a machine's Ray ends while the program
  runs (one line naming the machine), tells the driver to stop if it does not notice within
  a minute (a machine lost before any node was placed there), then makes the stop file, waits
  for every machine's step and exits with the driver's code (1 if a machine was lost).
  `scancel` sends SIGTERM to the driver, which stops the program in tiers as on one machine.
"""

from __future__ import annotations

import shlex

from magi_lp.cluster.host_scripts import WAIT_FUNCTION
from magi_lp.cluster.job import ClusterHost, ClusterJob
from magi_lp.cluster.ray_cluster import (
    NO_PRESTART,
    machine_nodes,
    ray_cli,
    ray_header_lines,
    ray_ports,
    resources_json,
    shell_command,
)
from magi_lp.cluster.slurm import (
    component_lines,
    node_address_function,
    sbatch_directives,
    split_settings,
)
from magi_lp.engines import ray_paths
from magi_lp.engines.base import host_resource

RAY_FOLDER = "magi_lp_ray.9999999999.999"
"""The longest name a machine's Ray folder gets in the script (`magi_lp_ray.<job id>.<machine
position>`), for the rule that keeps Ray's socket paths short."""

HEALTH_CHECKS = {
    "RAY_health_check_initial_delay_ms": "2000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "5000",
    "RAY_health_check_failure_threshold": "5",
}
"""How the head's GCS checks the other machines: a dead one is noticed in about 5 s."""

LOST_GRACE_S = 60
"""A machine's Ray ended and the driver still runs this much later: the script stops it (and
kills it as long again later)."""


def render_ray_sbatch(job: ClusterJob) -> str:
    """The batch script (text)."""
    hosts = head_first(job)
    lines = _allocation_lines(job, hosts)
    lines += _ray_setup_lines(job, hosts[0])
    for position, host in enumerate(hosts):
        lines += _ray_step_lines(job, host, position, het=len(hosts) > 1)
    lines += _all_joined_lines(job, hosts)
    lines += _driver_lines(job)
    lines += _stop_lines(het=len(hosts) > 1)
    return "\n".join(lines) + "\n"


def _allocation_lines(job: ClusterJob, hosts: list[ClusterHost]) -> list[str]:
    """The header, one heterogeneous component per machine, the job's environment and each
    machine's address as MAGI_LP_HOST_<HOST>."""
    settings = job.settings
    het = len(hosts) > 1
    lines = ["#!/bin/bash"]
    lines += [f"# {line}".rstrip() for line in ray_header_lines(job, "SLURM batch script")]
    lines += sbatch_directives(job)
    for position, host in enumerate(hosts):
        if position:
            lines.append("#SBATCH hetjob")
        lines += component_lines(host, tasks=1)
    project = shlex.quote(job.paths.project_dir)
    lines += [
        "",
        *split_settings(settings.get("setup", "")),
        "set -u",
        f"cd {project} || exit 1",
        "export PYTHONUNBUFFERED=1",
        f'export PYTHONPATH={project}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        f"PYTHON={shlex.quote(job.paths.python)}",
        f"RAY={shlex.quote(ray_cli(job))}",
        f"LOGS={shlex.quote(job.paths.log_dir)}",
        'mkdir -p "$LOGS"',
        "",
        *node_address_function(settings.get("address_suffix", ""), resolve=True),
    ]
    for position, host in enumerate(hosts):
        if host.address:
            lines.append(f'export {host.host_var}="$(node_ip {shlex.quote(host.address)})"')
            continue
        nodelist = f"SLURM_JOB_NODELIST_HET_GROUP_{position}" if het else "SLURM_JOB_NODELIST"
        lines.append(f'export {host.host_var}="$(node_address "${nodelist}")"')
    for host in hosts:
        lines.append(
            f'[ -n "${host.host_var}" ] || {{ echo "magi_lp: no address for machine '
            f'{host.name}" >&2; exit 1; }}'
        )
    return lines


def _ray_setup_lines(job: ClusterJob, head: ClusterHost) -> list[str]:
    """The job's token, Ray's settings and folders, and `ray_step`, which starts a machine's
    Ray in the background."""
    head_ports = ray_ports(head.base_port, machine_nodes(job, head.name))
    gcs = f"${head.host_var}:{head_ports.port('gcs')}"
    return [
        "",
        "# The job's Ray cluster: a token made here, for this job only, in the environment of",
        "# its processes (never in a file); Ray's files in a private folder on each machine.",
        "export RAY_AUTH_MODE=token",
        "RAY_AUTH_TOKEN=$(\"$PYTHON\" -c 'import secrets; print(secrets.token_hex(32))')",
        "export RAY_AUTH_TOKEN",
        *(f"export {k}={v}" for k, v in {**HEALTH_CHECKS, **NO_PRESTART}.items()),
        f"export AUTOSCALER_METRIC_PORT={head_ports.port('autoscaler_metrics')}",
        f'RAY_HEAD="{gcs}"',
        'RAY_LOGS="$LOGS/ray-${SLURM_JOB_ID:-0}"',
        "# Under TMPDIR where Ray's socket paths fit Linux's 107 bytes, else under /tmp.",
        'RAY_ROOT="${TMPDIR:-/tmp}"',
        f'[ "${{#RAY_ROOT}}" -le {ray_paths.longest_root(RAY_FOLDER)} ] || RAY_ROOT=/tmp',
        'RAY_TMP="$RAY_ROOT/magi_lp_ray.${SLURM_JOB_ID:-0}"',
        'RAY_STOP="$RAY_TMP.stop"',
        'mkdir -p "$RAY_LOGS"',
        'rm -f "$RAY_STOP"',
        "",
        *WAIT_FUNCTION,
        "pids=()",
        "machines=()",
        "ray_step() {  # ray_step MACHINE SRUN-ARGUMENTS...: a machine's Ray, in the background",
        "  local machine=$1; shift",
        '  srun "$@" &',
        "  pids+=($!)",
        '  machines+=("$machine")',
        "}",
        "",
    ]


def _ray_step_lines(job: ClusterJob, host: ClusterHost, position: int, *, het: bool) -> list[str]:
    """The `ray_step` of one machine (kept up by `magi_lp.cluster.ray_node`); after the
    head's, a wait until its GCS answers."""
    is_head = position == 0
    ports = ray_ports(host.base_port, machine_nodes(job, host.name))
    options = [f"--het-group={position}"] if het else []
    options += [
        f"--job-name=ray@{host.name}",
        "--nodes=1",
        "--ntasks=1",
        "--whole",
        "--kill-on-bad-exit=0",
    ]
    if host.gpus:
        options.append(f"--gres=gpu:{host.gpus}")
    keeper = [
        "--host",
        host.name,
        "--log",
        f"$RAY_LOGS/{host.name}.log",
        "--temp-dir",
        f"$RAY_TMP.{position}",
    ]
    keeper += ["--stop-file", "$RAY_STOP"] if is_head else ["--head", "$RAY_HEAD"]
    start = ["start", "--head"] if is_head else ["start", "--address=$RAY_HEAD"]
    start += [
        "--block",
        f"--node-ip-address=${host.host_var}",
        *ports.start_options(head=is_head),
        f"--temp-dir=$RAY_TMP.{position}",
        f"--resources={resources_json(host.name)}",
        f"--num-gpus={host.gpus or 0}",
    ]
    if host.cpus:
        start.append(f"--num-cpus={host.cpus}")
    if is_head:
        start.append("--include-dashboard=false")
    start.append("--disable-usage-stats")
    role = "head" if is_head else "node"
    lines = [
        f"ray_step {shlex.quote(host.name)} {' '.join(options)} \\\n"
        f'  "$PYTHON" -m magi_lp.cluster.ray_node {_quoted(keeper)} \\\n'
        f'  -- "$RAY" {_quoted(start)}'
    ]
    if is_head:
        lines += [
            f"# Ray's {role} first: the others join its GCS.",
            "for _ in $(seq 600); do",
            '  (exec 3<>"/dev/tcp/${RAY_HEAD%:*}/${RAY_HEAD##*:}") 2>/dev/null && break',
            '  kill -0 "${pids[0]}" 2>/dev/null || break',
            "  sleep 0.5",
            "done",
            'if ! kill -0 "${pids[0]}" 2>/dev/null; then',
            f"  echo \"magi_lp: Ray's head on machine {host.name} did not start; its log: "
            f'$RAY_LOGS/{host.name}.log" >&2',
            "  exit 1",
            "fi",
        ]
    return lines


def _all_joined_lines(job: ClusterJob, hosts: list[ClusterHost]) -> list[str]:
    """A wait until every machine's resource is in the cluster, failing the job in one line
    when a machine's Ray ends or the start timeout passes."""
    wanted = " ".join(host_resource(h.name) for h in hosts)
    timeout = int(job.stop.start_timeout_seconds)
    return [
        "# Every machine in the cluster (its resource in `ray status`) before the driver starts:",
        "# a machine that never joins fails the job here, in one line, instead of leaving the",
        "# driver waiting for it.",
        f"wanted=({wanted})",
        'missing=("${wanted[@]}")',
        f"deadline=$((SECONDS + {timeout}))",
        "while [ ${#missing[@]} -gt 0 ]; do",
        '  for i in "${!pids[@]}"; do',
        '    kill -0 "${pids[$i]}" 2>/dev/null && continue',
        '    echo "magi_lp: Ray on machine ${machines[$i]} did not start; its log:'
        ' $RAY_LOGS/${machines[$i]}.log" >&2',
        '    touch "$RAY_STOP"; wait; exit 1',
        "  done",
        "  if [ $SECONDS -ge $deadline ]; then",
        f'    echo "magi_lp: not every machine joined Ray within {timeout} s'
        ' (hosts.start_timeout_seconds): missing ${missing[*]}" >&2',
        '    touch "$RAY_STOP"; wait; exit 1',
        "  fi",
        "  sleep 1",
        '  status_text=$("$RAY" status --address="$RAY_HEAD" 2>/dev/null)',
        "  missing=()",
        '  for r in "${wanted[@]}"; do',
        '    grep -qw "$r" <<< "$status_text" || missing+=("$r")',
        "  done",
        "done",
        'echo "magi_lp: job ${SLURM_JOB_ID:-}: Ray cluster of ${#pids[@]} machines, head at'
        f" $RAY_HEAD ({', '.join(f'{h.name} at ${h.host_var}' for h in hosts)}); Ray's logs:"
        ' $RAY_LOGS" >&2',
    ]


def _driver_lines(job: ClusterJob) -> list[str]:
    """The driver in the background, and the trap that passes the job's SIGTERM on to it."""
    driver = shell_command([job.paths.python, *job.driver])
    return [
        "",
        "# The driver: the program graph on this Ray cluster, each launch group on its machine.",
        'export RAY_ADDRESS="$RAY_HEAD"',
        f"{driver} &",
        "driver=$!",
        "# scancel (or the time limit) SIGTERMs the driver and every step: the driver stops the",
        "# program in tiers; Ray stays up for that (magi_lp.cluster.ray_node) and stops after it.",
        "# (The trap may run inside the `sleep` below, whose stderr is silenced: it writes to a",
        "# copy of the script's own.)",
        "exec 9>&2",
        "trap 'echo \"magi_lp: SIGTERM: the job is being stopped; the driver stops the program in"
        ' tiers, then Ray stops on every machine" >&9; kill -TERM "$driver" 2>/dev/null\' TERM',
        "",
    ]


def _stop_lines(*, het: bool) -> list[str]:
    """The watch while the driver runs (a machine whose Ray ends is named, and the driver
    told to stop if it does not notice), then Ray's stop on every machine and the exit code."""
    return [
        "lost=()",
        "lost_at=",
        'while kill -0 "$driver" 2>/dev/null; do',
        '  for i in "${!pids[@]}"; do',
        '    if [ -z "${lost[$i]:-}" ] && ! kill -0 "${pids[$i]}" 2>/dev/null; then',
        '      wait_for "${pids[$i]}"; code=$?',
        '      lost[$i]="$(describe "$code")"',
        "      lost_at=${lost_at:-$SECONDS}",
        '      echo "magi_lp: Ray on machine ${machines[$i]} ended while the program ran'
        " (${lost[$i]}); its nodes are lost and the driver stops the program; Ray's log:"
        ' $RAY_LOGS/${machines[$i]}.log" >&2',
        "    fi",
        "  done",
        "  # The driver notices a lost machine through Ray; if it has not (a machine lost",
        "  # before a node was placed there), it is told to stop, then killed.",
        '  if [ -n "$lost_at" ]; then',
        f'    [ $((SECONDS - lost_at)) -ge {LOST_GRACE_S} ] && [ -z "${{termed:-}}" ] &&'
        ' termed=1 && kill -TERM "$driver" 2>/dev/null',
        f'    [ $((SECONDS - lost_at)) -ge {2 * LOST_GRACE_S} ] && kill -KILL "$driver"'
        " 2>/dev/null",
        "  fi",
        "  { sleep 0.5; } 2>/dev/null  # (no 'Terminated' line when SLURM's SIGTERM ends it)",
        "done",
        'wait_for "$driver"; status=$?',
        'echo "magi_lp: the driver ended: $(describe "$status"); stopping Ray on every'
        ' machine" >&2',
        'touch "$RAY_STOP"',
        'for i in "${!pids[@]}"; do',
        '  [ -n "${lost[$i]:-}" ] && continue',
        '  wait_for "${pids[$i]}"; code=$?',
        '  [ "$code" -eq 0 ] || echo "magi_lp: Ray on machine ${machines[$i]} failed at its stop:'
        ' $(describe "$code")" >&2',
        "done",
        'rm -f "$RAY_STOP"',
        "if [ ${#lost[@]} -gt 0 ]; then",
        '  for i in "${!lost[@]}"; do',
        "    # A machine whose step was killed could not remove Ray's folder there.",
        f"    timeout 60 srun {'--het-group=$i ' if het else ''}--nodes=1 --ntasks=1 --overlap"
        ' --job-name="cleanup@${machines[$i]}" rm -rf "$RAY_TMP.$i" 2>/dev/null',
        '    echo "magi_lp: the run failed: Ray on machine ${machines[$i]} died while the program'
        ' ran (${lost[$i]})" >&2',
        "  done",
        "  status=1",
        "fi",
        'echo "magi_lp: Ray stopped on all ${#pids[@]} machines; exit code $status" >&2',
        'exit "$status"',
    ]


def head_first(job: ClusterJob) -> list[ClusterHost]:
    """The machines that run nodes, the head first: the coordinator's machine (the counter and
    the replay are usually there too), where the batch script and the driver run."""
    head = job.node(job.coordinator).host
    hosts = [h for h in job.hosts if job.groups_on(h.name)]
    return sorted(hosts, key=lambda h: h.name != head)


def _quoted(argv: list[str]) -> str:
    """Shell words: `$VAR...` parts in double quotes (expanded), the rest quoted as is."""
    out = []
    for arg in argv:
        if "$" in arg:
            out.append('"' + arg.replace('"', '\\"') + '"')
        else:
            out.append(shlex.quote(arg))
    return " ".join(out)
