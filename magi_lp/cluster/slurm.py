"""The SLURM batch script of a multi-host job (`--launcher slurm`).

Shape of the script:
- one component of a heterogeneous job per host of the plan (`#SBATCH hetjob` between
  them; a single `#SBATCH` block for one host): the whole node (`--exclusive`), its GPUs
  (`--gres=gpu:N`), `--ntasks` = the nodes it runs. A host whose config gives an address
  gets `--nodelist=<address>`;
- the addresses of the nodes SLURM allocated are exported as MAGI_LP_HOST_<HOST> before any
  step starts: the node's NodeAddr (`scontrol show node`; SLURM sets it to the name where
  slurm.conf gives none), or its name plus `hosts.slurm.address_suffix` when that is set.
  Nodes read them when they resolve an address, so the pickled program does not depend on
  the allocation;
- one `srun` step per launch group, in the background: `--het-group` picks its host,
  `--ntasks` its nodes, `env <the group's env>` the placement plan's variables, and the
  node's task id is SLURM_PROCID. GPU steps ask for all the host's GPUs with `--overlap`
  (nodes pick theirs with CUDA_VISIBLE_DEVICES, numbered as on the host); CPU steps ask
  for `--cpus-per-task` when the plan knows it;
- each step is named after its launch group (`squeue -s`, `scancel <job>.<step>`);
- the script waits for every step and reports each failed one by name with its exit code
  (srun's own lines name the failed task), then the coordinator's lines saying why the
  program stopped (a dead node by name); it exits 1 if any step failed. Stopping goes
  through the coordinator's stop board; `scancel` sends SIGTERM to every node and to this
  script, which traps it to go on reporting, and the nodes stop in tiers (host_node).
"""

from __future__ import annotations

import shlex

from magi_lp.cluster.host_scripts import (
    env_array,
    preamble,
    shell_name,
    shell_node_command,
    starter,
)
from magi_lp.cluster.job import ClusterHost, ClusterJob, header_lines


def split_settings(text: str) -> list[str]:
    """A `;`-separated setting (`extra_sbatch`, `setup`) as its parts."""
    return [part.strip() for part in text.split(";") if part.strip()]


def sbatch_directives(job: ClusterJob) -> list[str]:
    """The job's `#SBATCH` lines both engines' batch scripts start with: its name, where
    SLURM writes its output, the settings SLURM has a flag for, and `extra_sbatch`."""
    settings = job.settings
    lines = [
        f"#SBATCH --job-name={job.name}",
        f"#SBATCH --output={job.paths.log_dir}/slurm-%j.out",
    ]
    for key in ("partition", "account", "qos", "time"):
        if settings.get(key):
            lines.append(f"#SBATCH --{key}={settings[key]}")
    lines += [f"#SBATCH {option}" for option in split_settings(settings.get("extra_sbatch", ""))]
    return lines


def component_lines(host: ClusterHost, tasks: int) -> list[str]:
    """The `#SBATCH` lines of one machine's component: the whole node, its GPUs."""
    lines = [
        f"# host {host.name}",
        "#SBATCH --nodes=1",
        f"#SBATCH --ntasks={tasks}",
        "#SBATCH --exclusive",
    ]
    if host.gpus:
        lines.append(f"#SBATCH --gres=gpu:{host.gpus}")
    if host.address:
        lines.append(f"#SBATCH --nodelist={host.address}")
    return lines


def _component(job: ClusterJob, host_index: int) -> list[str]:
    host = job.hosts[host_index]
    return component_lines(host, sum(len(g.nodes) for g in job.groups_on(host.name)))


def node_address_function(suffix: str, *, resolve: bool = False) -> list[str]:
    """Shell lines defining `node_address NODELIST` (the allocated node's NodeAddr, or its
    name + `suffix`) and, with `resolve`, `node_ip NAME` (its IPv4 address), used by it."""
    lines = [
        "# Where the nodes of each host are reached: the node SLURM allocated to it, at its",
        "# NodeAddr (slurm.conf; the node's name where none is set)"
        + (f", or its name + {suffix!r} (hosts.slurm.address_suffix)." if suffix else "."),
    ]
    if resolve:
        lines += [
            "node_ip() {  # node_ip NAME-OR-ADDRESS: its IPv4 address (Ray wants an address)",
            '  getent ahostsv4 "$1" 2>/dev/null | awk \'NR == 1 {print $1}\' | grep . || echo "$1"',
            "}",
        ]
    lines += [
        "node_address() {  # node_address NODELIST",
        "  local name address",
        '  name=$(scontrol show hostnames "$1" | head -n 1)',
    ]
    echo = "node_ip " if resolve else "echo "
    if suffix:
        lines.append(f'  {echo}"$name{suffix}"')
    else:
        lines += [
            "  address=$(scontrol show node \"$name\" 2>/dev/null | tr ' ' '\\n' \\",
            "    | sed -n 's/^NodeAddr=//p' | head -n 1)",
            f'  {echo}"${{address:-$name}}"',
        ]
    lines.append("}")
    return lines


def render_sbatch(job: ClusterJob) -> str:
    """The batch script (text)."""
    settings = job.settings
    hosts = [h for h in job.hosts if job.groups_on(h.name)]
    het = len(hosts) > 1
    lines = ["#!/bin/bash"]
    lines += [f"# {line}".rstrip() for line in header_lines(job, "SLURM batch script")]
    lines += sbatch_directives(job)
    indices = [job.hosts.index(h) for h in hosts]
    for position, index in enumerate(indices):
        if position:
            lines.append("#SBATCH hetjob")
        lines += _component(job, index)
    lines += ["", *split_settings(settings.get("setup", "")), "set -u", *preamble(job), ""]

    lines += node_address_function(settings.get("address_suffix", ""))
    for position, host in enumerate(hosts):
        if host.address:
            lines.append(f"# host {host.name}: {host.address} (from the config)")
            continue
        nodelist = f"SLURM_JOB_NODELIST_HET_GROUP_{position}" if het else "SLURM_JOB_NODELIST"
        lines += [
            f'export {host.host_var}="$(node_address "${nodelist}")"',
            f'[ -n "${host.host_var}" ] || {{ echo "magi_lp: no address for host {host.name} '
            f'(its node list: ${nodelist})" >&2; exit 1; }}',
        ]
    allocated = [f"{h.name} at ${h.host_var}" for h in hosts if not h.address]
    if allocated:
        lines.append(f'echo "magi_lp: job ${{SLURM_JOB_ID:-}}: {", ".join(allocated)}" >&2')
    lines.append("")
    for host in hosts:
        for group in job.groups_on(host.name):
            lines += env_array(group)
    lines += [
        "",
        *starter("step", "NAME SRUN-ARGUMENTS...: one srun step in the background", "srun"),
        "",
    ]
    for position, host in enumerate(hosts):
        for group in job.groups_on(host.name):
            options = [f"--het-group={position}"] if het else []
            options += [
                f"--job-name={group.launch_group}",
                "--nodes=1",
                f"--ntasks={len(group.nodes)}",
                "--kill-on-bad-exit=0",
            ]
            if group.gpus:
                options += [f"--gres=gpu:{host.gpus}", "--overlap"]
            else:
                options.append("--exact")
            if group.cpus:
                options.append(f"--cpus-per-task={group.cpus}")
            command = shell_node_command(group.launch_group, ["--task_var", "SLURM_PROCID"])
            name = f"{group.launch_group} on {host.name}"
            lines.append(
                f"step {shlex.quote(name)} {' '.join(options)} \\\n"
                f'  env "${{{shell_name(group.launch_group)}[@]}}" \\\n'
                f'  {command} --log_dir "$LOGS"'
            )
    coordinator_log = f"$LOGS/{job.coordinator}"
    lines += [
        'echo "magi_lp: started ${#pids[@]} srun steps; node logs: $LOGS/<group>/<task>" >&2',
        "# scancel (or the time limit) SIGTERMs every node and this script: the nodes stop in",
        "# tiers through the coordinator; this script stays to report how each step ended.",
        "trap 'echo \"magi_lp: SIGTERM: the job is being stopped; the nodes stop in tiers through"
        " the coordinator\" >&2' TERM",
        "",
        "status=0",
        'for i in "${!pids[@]}"; do',
        '  wait_for "${pids[$i]}"; code=$?',
        '  if [ "$code" -ne 0 ]; then',
        '    echo "magi_lp: step ${names[$i]} failed: $(describe "$code") (srun\'s lines name'
        ' the task: task N is node <group>/N, log $LOGS/<group>/N)" >&2',
        "    status=1",
        "  fi",
        "done",
        "# The coordinator's verdict: which node stopped the program, and why.",
        f'grep -h -e ": stopping [0-9]* nodes" -e "presumed dead" -e "stopped because" '
        f'"{coordinator_log}" 2>/dev/null | sed "s/^/magi_lp: coordinator: /" >&2',
        'echo "magi_lp: all ${#pids[@]} steps ended; exit code $status" >&2',
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"
