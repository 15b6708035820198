"""`python -m benchmarks.gpu_check`: the command line, the machine facts and the saved result."""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time
from pathlib import Path
from typing import Any

import benchmarks.gpu_check as package
from benchmarks.common import REPO, git_commit
from benchmarks.gpu_check.harness import NvmlProcesses
from benchmarks.gpu_check.parts import run_check
from benchmarks.gpu_check.report import text_summary
from benchmarks.gpu_check.settings import PARTS, RESULT, UNMEASURED
from benchmarks.gpu_check.workloads import worker_main
from magi_lp.placement.jax_build import installed_version


def _sizes(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    return {
        "batch": 256,
        "image": 84,
        "render_size": 84,
        "max_actors": args.max_actors or (2 if quick else 8),
        "learner_seconds": 5.0 if quick else 20.0,
        "render_seconds": 3.0 if quick else 10.0,
        "sample_every_s": 1.0,  # NVML's per-process numbers move slowly; 1 s apart is plenty
    }


def machine_facts(inventory: Any) -> dict[str, Any]:
    return {
        "gpu": ", ".join(f"{g.name} ({g.memory_total_bytes / 2**30:.0f} GiB)" for g in inventory)
        or "none",
        "driver": inventory.driver_version,
        "cuda_driver_version": inventory.cuda_driver_version,
        "python": platform.python_version(),
        "jax": installed_version("jax"),
        "jaxlib": installed_version("jaxlib"),
    }


def _save(out: Path, result: dict) -> str:
    """Writes `result` unless it would replace a GPU measurement with a non-measurement."""
    if result["status"] != "ok" and out.exists():
        with contextlib.suppress(OSError, ValueError):
            if json.loads(out.read_text()).get("status") == "ok":
                return f"kept the measured result in {out}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return f"wrote {out}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check", description=package.__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--out",
        default="",
        help=f"where the JSON result goes (default {RESULT.relative_to(REPO)}; "
        f"{UNMEASURED.relative_to(REPO)} when nothing was measured)",
    )
    parser.add_argument("--quick", action="store_true", help="short windows, up to 2 actors")
    parser.add_argument("--max-actors", type=int, default=0, help="most actors per variant")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"any of {', '.join(PARTS)}")
    parser.add_argument("--worker", choices=("learner", "actor", "render"), help=argparse.SUPPRESS)
    parser.add_argument("--status", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    parser.add_argument("--image", type=int, default=84, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--tiny-net", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--envs", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")

    from magi_lp.placement.gpu_inventory import query_inventory
    from magi_lp.placement.jax_build import detect_jax_build

    out = Path(args.out) if args.out else RESULT
    unmeasured_out = Path(args.out) if args.out else UNMEASURED
    started = time.monotonic()
    inventory = query_inventory()
    result: dict[str, Any] = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": git_commit(),
        "machine": machine_facts(inventory),
    }
    if not inventory.gpus:
        reason = f"no GPU ({inventory.reason or 'NVML listed none'})"
        saved = _save(unmeasured_out, {"status": "skipped", "reason": reason, **result})
        print(f"gpu_check: {reason}; nothing to measure here ({saved})")
        return 0
    build = detect_jax_build()
    if not build.serves_cuda:
        reason = (
            f"GPU {inventory.describe()} found, but this Python's JAX cannot use it "
            f"({build.describe()}): run `make setup JAX=cuda12`, or `make gpu-check "
            "GPU_CHECK_PYTHON=<a Python with CUDA JAX>`"
        )
        saved = _save(unmeasured_out, {"status": "error", "reason": reason, **result})
        print(f"gpu_check: {reason} ({saved})")
        return 1
    nvml = NvmlProcesses()
    try:
        measured = run_check(parts, _sizes(args), inventory, nvml)
    finally:
        nvml.close()
    result = {"status": "ok", **result, **measured}
    result["seconds"] = round(time.monotonic() - started, 1)
    print(_save(out, result))
    print(text_summary(result))
    return 0
