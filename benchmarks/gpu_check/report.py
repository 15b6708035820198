"""The GPU check's results in words: a few terminal lines, and figure 7 of BENCHMARKS.md."""

from __future__ import annotations

from typing import Any

from benchmarks.common import fmt
from benchmarks.gpu_check.settings import CONFIG, VARIANTS


def _mib(value: Any) -> str:
    if value is None:
        return "-"
    if value < 0:
        return "listed (amount n/a)"
    return f"{value:,.0f}"


def text_summary(result: dict) -> str:
    """A few lines for the terminal."""
    lines = [f"GPU: {result['machine']['gpu']}, driver {result['machine']['driver']}"]
    learner = result.get("learner")
    if learner and learner.get("state") == "done":
        lines.append(
            f"learner: {learner['updates_per_second']:.1f} updates/s at batch "
            f"{learner['batch_size']}, {learner['observation']} "
            f"(first call {learner['first_call_s']:.1f} s) on {learner['device']}"
        )
    node = result.get("cpu_node")
    if node:
        lines.append(f"CPU node under the plan: {_mib(node['gpu_mib'])} MiB on the GPU")
    for name in VARIANTS:
        run = result.get("memory", {}).get(name)
        if run:
            lines.append(
                f"memory, {name}: learner {_mib(run['learner_mib'])} MiB, per actor "
                f"{_mib(run['per_actor_mib'])} MiB; ran with {run['largest_n_ran']} actors "
                f"(tried {run['tried_up_to']})"
            )
    render = result.get("render")
    if render and render.get("state") == "done":
        lines.append(
            f"render: {render['frames_per_second']:.0f} frames/s at 84x84 "
            f"({render.get('gl_renderer', 'renderer unknown')})"
        )
    return "\n".join(lines)


def summary(result: dict) -> tuple[str, str, str]:
    """(number, comparison, ratio) for the page's table."""
    memory = result.get("memory", {})
    planned, defaults = memory.get("planned"), memory.get("defaults")
    learner = result.get("learner", {})
    rate = learner.get("updates_per_second") if learner.get("state") == "done" else None
    number = f"{fmt(rate, 1)} learner updates/s on {result['machine']['gpu']}"
    comparison = ratio = ""
    if planned and defaults:
        number += (
            f"; plan: learner {_mib(planned['learner_mib'])} MiB + "
            f"{_mib(planned['per_actor_mib'])} MiB per actor, ran {planned['largest_n_ran']}"
        )
        comparison = (
            f"JAX defaults: learner {_mib(defaults['learner_mib'])} MiB, per actor "
            f"{_mib(defaults['per_actor_mib'])} MiB, ran {defaults['largest_n_ran']} "
            f"actors of {defaults['tried_up_to']}"
        )
    return number, comparison, ratio


def report(result: dict) -> str:
    """Markdown for BENCHMARKS.md."""
    if result.get("status") != "ok":
        return ""
    m = result["machine"]
    lines = [
        f"Measured with `make gpu-check` on **{m['gpu']}**, NVIDIA driver {m['driver']} "
        f"(CUDA {m['cuda_driver_version'] // 1000}.{m['cuda_driver_version'] % 1000 // 10}), "
        f"Python {m['python']}, jax {m['jax']} / jaxlib {m['jaxlib']} "
        f"({result['inventory']['jax_build']}), {result['measured_at']}, commit "
        f"{result['commit']}, {result.get('seconds', '?')} s. Raw numbers: "
        "`benchmarks/gpu_check.json`.",
        "",
    ]
    if "plan" in result:
        lines += [
            f"The plan of `{CONFIG}` on that machine:",
            "",
            "```",
            *[f"notice: {n}" for n in result["plan"]["notices"]],
            result["plan"]["table"],
            "```",
            "",
        ]
    lines += _learner_lines(result.get("learner"))
    lines += _cpu_node_lines(result.get("cpu_node"))
    lines += _memory_lines(result.get("memory"))
    lines += _render_lines(result.get("render"))
    lines += _shared_report(result.get("shared"))
    from benchmarks.gpu_check.reckoning import report_lines

    reckoned = report_lines(result.get("reckoning"))
    if reckoned:
        lines += ["", *reckoned]
    return "\n".join(lines)


def _learner_lines(learner: dict | None) -> list[str]:
    """The learner's updates/s (and, with the frame replay's batch, its variants)."""
    if not learner:
        return []
    if learner.get("state") != "done":
        return [f"**Learner** failed: `{learner.get('error', learner.get('state'))}`", ""]
    line = (
        f"**Learner**: {learner['updates_per_second']:.1f} updates/s at batch "
        f"{learner['batch_size']}, {learner['observation']} on {learner['device']} "
        f"({learner['backend']}), first call "
        f"(compile) {learner['first_call_s']:.1f} s apart; the process held "
        f"{_mib(learner['gpu_mib'])} MiB. The paper's V100: 24 updates/s."
    )
    if "batch" in learner:  # the frame replay's batch through the prefetcher
        variants = [
            f"{learner[key]:.1f} updates/s {label}"
            for key, label in (
                ("device_batch_per_second", "on a batch already on the device (the update alone)"),
                ("host_batch_per_second", "with each call copying its numpy batch (no prefetch)"),
            )
            if learner.get(key) is not None
        ]
        line += f" Batches: {learner['batch']}, through the learner's device prefetcher" + (
            f"; {'; '.join(variants)}." if variants else "."
        )
    return [line, ""]


def _cpu_node_lines(node: dict | None) -> list[str]:
    """What a CPU node (the plan's actor env) held of the GPU."""
    if not node:
        return []
    listed = "listed by NVML" if node["listed_by_nvml"] else "not listed by NVML"
    return [
        f"**CPU node** (the plan's actor env, device {node['device']}, running the "
        f"policy forward on {node.get('backend', '?')}): {_mib(node['gpu_mib'])} MiB, "
        f"{listed}; GPU memory in use before / during: "
        f"{', '.join(_mib(v) for v in node['gpu_used_before_mib'])} / "
        f"{', '.join(_mib(v) for v in node['gpu_used_during_mib'])} MiB.",
        "",
    ]


def _memory_lines(memory: dict | None) -> list[str]:
    """GPU memory per process, each variant's steps, and the largest N measured and computed."""
    if not memory:
        return []
    lines = [
        f"**GPU memory per process** on {memory['gpu']} ({memory['total_mib']:,} MiB), "
        "NVML by pid, peak of 3 samples once every process was running its workload:",
        "",
        "| variant | actors | learner MiB | MiB per actor | all ran |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in VARIANTS:
        run = memory.get(name)
        for step in run["steps"] if run else []:
            lines.append(
                f"| {name} | {step['actors']} | {_mib(step['learner_mib'])} "
                f"| {', '.join(_mib(v) for v in step['actor_mib']) or '-'} "
                f"| {'yes' if step['all_ran'] else 'no'} |"
            )
    lines += [
        "",
        "| variant | largest N that ran (measured) | largest N the GPU holds (computed: "
        "free after the learner / MiB per actor) |",
        "| --- | --- | --- |",
    ]
    for name in VARIANTS:
        run = memory.get(name)
        if not run:
            continue
        computed = run["largest_n_computed"]
        computed_text = (
            "not limited by GPU memory (actors hold none)" if computed is None else computed
        )
        if name == "gpu_actors" and "plan_admits" in run:
            computed_text = f"{computed_text}; the plan's fractions admit {run['plan_admits']}"
        failure = (
            f" (stopped: {run['failure']['process']}: {run['failure']['error'][:160]})"
            if run["failure"]
            else f" (tried up to {run['tried_up_to']})"
        )
        lines.append(f"| {name} | {run['largest_n_ran']}{failure} | {computed_text} |")
    if not any(memory[n]["pids_listed"] for n in VARIANTS if n in memory):
        lines += [
            "",
            "NVML listed none of these processes (a container's pid namespace?): "
            "compare the GPU totals in the JSON instead.",
        ]
    return [*lines, ""]


def _render_lines(render: dict | None) -> list[str]:
    """The rendering rate with MuJoCo's GL, or why it was not measured."""
    if not render:
        return []
    if render.get("state") != "done":
        reason = render.get("reason") or render.get("error")
        return [f"**Rendering**: {render.get('state')}: {reason}", ""]
    return [
        f"**Rendering**: {render['frames_per_second']:.0f} frames/s "
        f"(mj_step + update_scene + render) at {render['frame']} with MuJoCo "
        f"{render['mujoco']}, MUJOCO_GL={render['mujoco_gl']}, GL renderer "
        f"`{render.get('gl_renderer', 'unknown')}`; the process held "
        f"{_mib(render['gpu_mib'])} MiB.",
        "",
    ]


def _shared_report(shared: dict | None) -> list[str]:
    if not shared:
        return []
    learner, actors = shared["learner"], shared["actors"]
    done = learner.get("state") == "done" and all(a.get("state") == "done" for a in actors)
    if not done:
        failed = next(p for p in [learner, *actors] if p.get("state") != "done")
        return [f"**1-GPU shared layout** failed: `{failed.get('error', failed.get('state'))}`"]
    fractions = shared["fractions"]
    lines = [
        f"**1-GPU shared layout** (`{shared['config']}`, `{shared['device_split']}`): the "
        f"learner (gpu_memory {fractions['learner']}) and {len(actors)} GPU actors (at most "
        f"{fractions['actor']} each, {shared['envs_per_actor']} environments per batched "
        "policy call) at once on one GPU, each its own process:",
        "",
        "| process | GPU MiB | rate while sharing |",
        "| --- | --- | --- |",
        f"| learner | {_mib(learner['gpu_mib'])} | {learner['updates_per_second']:.1f} updates/s "
        f"(batch {learner['batch_size']}, {learner['observation']}) |",
    ]
    for index, actor in enumerate(actors):
        lines.append(
            f"| actor {index} | {_mib(actor['gpu_mib'])} | "
            f"{actor['actions_per_second']:.0f} actions/s ({actor['steps_per_second']:.0f} "
            f"batched calls/s) |"
        )
    return lines
