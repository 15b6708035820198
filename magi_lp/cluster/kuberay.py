"""The KubeRay RayJob of a job on several machines (`--launcher kubernetes`, current stack).

One object, applied with `kubectl apply -f` to a cluster that runs the KubeRay operator
(>= 1.6, for `authOptions`): a `RayJob` (`ray.io/v1`) whose RayCluster has
- a head group: the Ray head, where KubeRay's job submitter runs the entrypoint (the driver:
  the entry point with `--launcher ray`; KubeRay sets RAY_ADDRESS for it). It offers no CPU
  to Ray (`num-cpus: "0"`): no node of the program runs there;
- a worker group per machine of the host plan, one replica each: its `rayStartParams` offer
  the machine's custom resource (`magi_lp_host_<host>`) and its GPUs, the pod asks for the
  machine's CPUs and all its GPUs (so the plan's GPU ids are the pod's) and runs on the
  machine's `node_selector`. The env every launch group of the machine agrees on is the
  container's; each group's whole env is in the pod's annotations, and the driver gives each
  node its group's env through Ray's runtime_env;
- token authentication (`authOptions.mode: token`): KubeRay makes a Secret with the token and
  puts it in every Ray container's environment;
- the shared volume (the workdir, the code and the virtualenv at the same paths).
`shutdownAfterJobFinishes` deletes the RayCluster when the driver ends. A stop of the job
(`kubectl delete`, a suspend, a deadline) gets the driver's whole stop in tiers: Ray Jobs waits
`RAY_JOB_STOP_WAIT_TIME_S` between its SIGTERM to the driver and its SIGKILL (3 s by default,
too short for the learner's final save), set in the job's runtime env (`stop_wait_seconds`).
"""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

import yaml

from magi_lp.cluster.job import ClusterJob, common_env
from magi_lp.cluster.kubernetes import APP_LABEL, INSTANCE_LABEL
from magi_lp.cluster.ray_cluster import ray_header_lines
from magi_lp.engines.base import host_resource
from magi_lp.runtime.config import stop_tiers

RAY_VERSION = "2.60.0"
"""The Ray the image must have (requirements-py312.txt), for KubeRay's `rayVersion`."""

HEAD_REQUESTS = {"cpu": "1", "memory": "4Gi"}
"""The head pod: the Ray head and the driver, which builds the program (no node runs there)."""

STOP_WAIT_VAR = "RAY_JOB_STOP_WAIT_TIME_S"
"""Ray Jobs' wait, in whole seconds, between its stop signal to the driver and its SIGKILL (read
by its JobSupervisor actor from its environment: the job's runtime env)."""

_STOP_STAGES = len(set(stop_tiers(several_hosts=False).values()))
_VOLUME = "shared"
_ENV_ANNOTATION = "magi-lp/env."


def _labels(job: ClusterJob) -> dict[str, str]:
    return {APP_LABEL: "magi-lp", INSTANCE_LABEL: job.name}


def _selector(text: str) -> dict[str, str]:
    pairs = [p.strip() for p in text.split(",") if p.strip()]
    return {k.strip(): v.strip() for k, _, v in (p.partition("=") for p in pairs)}


def _container(job: ClusterJob, name: str, env: dict[str, str]) -> dict[str, Any]:
    settings = job.settings
    return {
        "name": name,
        "image": settings["image"],
        "imagePullPolicy": settings["image_pull_policy"],
        "workingDir": job.paths.project_dir,
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "volumeMounts": [{"name": _VOLUME, "mountPath": settings["volume_mount"]}],
    }


def _pod(job: ClusterJob, container: dict[str, Any], selector: str = "") -> dict[str, Any]:
    settings = job.settings
    pod: dict[str, Any] = {}
    if settings.get("service_account"):
        pod["serviceAccountName"] = settings["service_account"]
    if _selector(selector):
        pod["nodeSelector"] = _selector(selector)
    # The driver's stop in tiers (the learner's final save) ends before the pods are killed.
    pod["terminationGracePeriodSeconds"] = stop_wait_seconds(job)
    pod["containers"] = [container]
    pod["volumes"] = [
        {"name": _VOLUME, "persistentVolumeClaim": {"claimName": settings["volume_claim"]}}
    ]
    return pod


def stop_wait_seconds(job: ClusterJob) -> int:
    """How long the driver's stop may take: each of its stages (actors, the learner, replay and
    counter) up to the termination notice, and 20 s for Ray's shutdown after."""
    return math.ceil(job.stop.notice_seconds) * _STOP_STAGES + 20


def _machine_env(job: ClusterJob, host: str) -> dict[str, str]:
    """The variables every launch group of `host` has with the same value."""
    groups = job.groups_on(host)
    shared = dict(groups[0].env) if groups else {}
    for group in groups[1:]:
        shared = {k: v for k, v in shared.items() if group.env.get(k) == v}
    return {k: v for k, v in shared.items() if v != ""}


def worker_group(job: ClusterJob, host_name: str) -> dict[str, Any]:
    """One machine of the plan: a worker group of one replica offering its resource."""
    host = job.host(host_name)
    groups = job.groups_on(host_name)
    container = _container(job, "ray-worker", {**common_env(job), **_machine_env(job, host_name)})
    resources: dict[str, Any] = {}
    if host.cpus:
        resources["requests"] = {"cpu": str(host.cpus)}
    if host.gpus:
        resources["limits"] = {"nvidia.com/gpu": host.gpus}
    if resources:
        container["resources"] = resources
    start = {
        "resources": json.dumps(json.dumps({host_resource(host_name): 1})),
        "num-gpus": str(host.gpus or 0),
    }
    if host.cpus:
        start["num-cpus"] = str(host.cpus)
    annotations = {
        "magi-lp/nodes": ", ".join(n.name for g in groups for n in g.nodes),
        **{
            _ENV_ANNOTATION + g.launch_group.replace("@", ".at."): " ".join(
                f"{k}={v}" for k, v in g.env.items()
            )
            for g in groups
        },
    }
    return {
        "groupName": host_name,
        "replicas": 1,
        "minReplicas": 1,
        "maxReplicas": 1,
        "rayStartParams": start,
        "template": {
            "metadata": {"labels": _labels(job), "annotations": annotations},
            "spec": _pod(job, container, host.node_selector),
        },
    }


def rayjob(job: ClusterJob) -> dict[str, Any]:
    """The RayJob object."""
    settings = job.settings
    head = _container(job, "ray-head", common_env(job))
    head["resources"] = {"requests": dict(HEAD_REQUESTS)}
    entrypoint = f"cd {shlex.quote(job.paths.project_dir)} && " + " ".join(
        shlex.quote(a) for a in (job.paths.python, *job.driver)
    )
    hosts = [h.name for h in job.hosts if job.groups_on(h.name)]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": job.name,
            "namespace": settings["namespace"],
            "labels": _labels(job),
        },
        "spec": {
            "entrypoint": entrypoint,
            "runtimeEnvYAML": yaml.safe_dump(
                {"env_vars": {STOP_WAIT_VAR: str(stop_wait_seconds(job))}}
            ),
            "submissionMode": "K8sJobMode",
            "backoffLimit": 0,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "rayClusterSpec": {
                "rayVersion": RAY_VERSION,
                "enableInTreeAutoscaling": False,
                "authOptions": {"mode": "token"},
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0"},
                    "template": {
                        "metadata": {"labels": _labels(job)},
                        "spec": _pod(job, head),
                    },
                },
                "workerGroupSpecs": [worker_group(job, host) for host in hosts],
            },
        },
    }


def render_rayjob(job: ClusterJob) -> str:
    """The RayJob as YAML, with the header as comments."""
    header = "\n".join(f"# {line}".rstrip() for line in ray_header_lines(job, "KubeRay RayJob"))
    body = yaml.safe_dump(rayjob(job), sort_keys=False, default_flow_style=False, width=1000)
    return f"{header}\n---\n{body}"
