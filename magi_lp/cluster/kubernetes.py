"""The Kubernetes manifests of a multi-host job (`--launcher kubernetes`).

One YAML file, applied with `kubectl apply -f`:
- a headless Service named after the job: with `subdomain` set to it, every pod of an
  Indexed Job gets the DNS name `<job>-<index>.<service>`, which is the address the program
  was pickled with (`ClusterJob.address_of`);
- a NetworkPolicy (unless `hosts.kubernetes.network_policy=False`) that lets only the
  program's own pods reach its pods: Courier and Reverb have no authentication;
- one Indexed Job per launch group: `completions` = `parallelism` = its nodes, the node's
  task id is JOB_COMPLETION_INDEX, `backoffLimit: 0` (a failed node fails its Job instead of
  restarting alone; its pod keeps the exit code and `kubectl logs` its output), the group's
  env, `nvidia.com/gpu` limits for GPU nodes (each pod sees its GPUs as 0..n-1), CPU
  requests when the plan knows them, the machine's node selector, and the shared volume
  (a ReadWriteMany PersistentVolumeClaim) holding the workdir and the pickled program.
Every node's servers use the same ports in its own pod (`port_per_pod` in the host plan).
"""

from __future__ import annotations

from typing import Any

import yaml

from magi_lp.cluster.job import ClusterGroup, ClusterJob, common_env, header_lines, node_command

APP_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
GROUP_LABEL = "magi-lp/launch-group"
_VOLUME = "shared"


def _labels(job: ClusterJob, group: ClusterGroup | None = None) -> dict[str, str]:
    labels = {APP_LABEL: "magi-lp", INSTANCE_LABEL: job.name}
    if group is not None:
        labels[GROUP_LABEL] = job.job_name(group.launch_group)[len(job.name) + 1 :]
    return labels


def _selector(text: str) -> dict[str, str]:
    pairs = [p.strip() for p in text.split(",") if p.strip()]
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key.strip()] = value.strip()
    return out


def _ports(job: ClusterJob) -> list[int]:
    return sorted({p for n in job.nodes for p in n.ports})


def service(job: ClusterJob) -> dict[str, Any]:
    """The headless Service that names every pod."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": job.service_name,
            "namespace": job.settings["namespace"],
            "labels": _labels(job),
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": _labels(job),
            "ports": [
                {"name": f"port-{port}", "port": port, "targetPort": port} for port in _ports(job)
            ],
        },
    }


def network_policy(job: ClusterJob) -> dict[str, Any]:
    """Only this program's pods may connect to this program's pods."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{job.name}-private",
            "namespace": job.settings["namespace"],
            "labels": _labels(job),
        },
        "spec": {
            "podSelector": {"matchLabels": _labels(job)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": _labels(job)}}]}],
        },
    }


def indexed_job(job: ClusterJob, group: ClusterGroup) -> dict[str, Any]:
    """The Indexed Job that runs one launch group's nodes."""
    settings = job.settings
    env = {**common_env(job), **group.env}
    command = node_command(job, group.launch_group, ["--task_var", "JOB_COMPLETION_INDEX"])
    resources: dict[str, Any] = {}
    if group.cpus:
        resources["requests"] = {"cpu": str(group.cpus)}
    if group.gpus:
        resources["limits"] = {"nvidia.com/gpu": group.gpus}
    container: dict[str, Any] = {
        "name": "node",
        "image": settings["image"],
        "imagePullPolicy": settings["image_pull_policy"],
        "workingDir": job.paths.project_dir,
        "command": command,
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [
            {"containerPort": port, "name": f"port-{port}"}
            for port in sorted({p for n in group.nodes for p in n.ports})
        ],
    }
    if resources:
        container["resources"] = resources
    container["volumeMounts"] = [{"name": _VOLUME, "mountPath": settings["volume_mount"]}]
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": job.service_name,
    }
    if settings.get("service_account"):
        pod["serviceAccountName"] = settings["service_account"]
    selector = _selector(job.host(group.host).node_selector)
    if selector:
        pod["nodeSelector"] = selector
    # Longer than a node's own notice, so a stopped node saves and exits by itself.
    pod["terminationGracePeriodSeconds"] = int(job.stop.notice_seconds) + 20
    pod["containers"] = [container]
    pod["volumes"] = [
        {"name": _VOLUME, "persistentVolumeClaim": {"claimName": settings["volume_claim"]}}
    ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job.job_name(group.launch_group),
            "namespace": settings["namespace"],
            "labels": _labels(job, group),
            "annotations": {"magi-lp/nodes": ", ".join(n.name for n in group.nodes)},
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": len(group.nodes),
            "parallelism": len(group.nodes),
            "backoffLimit": 0,
            "template": {"metadata": {"labels": _labels(job, group)}, "spec": pod},
        },
    }


def manifests(job: ClusterJob) -> list[dict[str, Any]]:
    """Every object, in the order `kubectl apply` should create them."""
    objects = [service(job)]
    if job.settings.get("network_policy", True):
        objects.append(network_policy(job))
    objects += [indexed_job(job, group) for group in job.groups]
    return objects


def render_manifests(job: ClusterJob) -> str:
    """The manifests as one multi-document YAML file, with the header as comments."""
    header = "\n".join(f"# {line}".rstrip() for line in header_lines(job, "Kubernetes manifests"))
    body = yaml.safe_dump_all(manifests(job), sort_keys=False, default_flow_style=False, width=1000)
    return f"{header}\n---\n{body}"
