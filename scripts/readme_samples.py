"""Writes the command samples of README.md and docs/*.md from running each command now.

Every `$ command` and `error: ...` sample of README.md and of the docs pages (`pages()`: all of
docs/*.md but `HAND_WRITTEN`) stands between two markers, in whichever page it lives in,

    <!-- sample NAME: make docs (scripts/readme_samples.py --write) -->
    ```
    $ python projects/drq_v2/lp_main.py ...
    error: ...
    ```
    <!-- end of sample -->

and `SAMPLES` below says what NAME runs: its commands (from the repository root, with this
Python as `python`), the machine they see, the exit status each must end with, and which lines
of the output the page shows (all of them unless `show` picks some; a run of lines left out is
one `...` line). Each sample is marked once, in one page (`located`: moving a section to another
page moves its samples with it). So no sample is typed by hand, and a changed message reaches
the pages through

    make docs                                   # or:
    python scripts/readme_samples.py --write    # run every sample, write each into its page
    python scripts/readme_samples.py --check    # exit 1, with a diff, where a page differs
    python scripts/readme_samples.py [NAME ...] # print samples

tests/test_readme.py fails, naming `make docs`, while a sample differs from what its command
prints now (and while a `$ command` or `error: ...` block of a page is outside the markers).

What the commands see of the machine is pinned, so that a sample reads the same wherever it
is regenerated:
  - the GPUs: a fake NVML (tests/fake_nvidia.py, first on PYTHONPATH), with no driver
    ("NVML Shared Library Not Found", as on this project's machine) or with 80 GB H100s, and
    where a sample needs it a fake CUDA plugin for JAX (the H100 samples' reckoning then
    compiles on this CPU, as its lines say);
  - the cores: each command runs on 2 CPUs (its affinity), as this project's machine has;
  - the RAM: psutil reports `MEMORY_TOTAL` bytes in all (this project's machine's), through a
    `sitecustomize` first on PYTHONPATH.
Not pinned, so checked instead (`unpinned`: the test skips a sample the machine cannot give):
the Python (the Launchpad stack's, `.venv`), its JAX build (the CPU-only one `make setup`
installs without a GPU), at least 2 CPUs, and for the plan, a network namespace (its last
line).

Normalised: only the fake machine's temporary folder, should an output name it (`<tmp>`). No
sample prints a pid, a time or a duration, so nothing else is.

Two samples compile DrQ-v2's full update (`reckoning`, `reckoning-refusal`: the reckoning of
`gpu_memory='auto'` on the fake H100, 20 to 70 s each here); the others exit within seconds.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

README = ROOT / "README.md"
HAND_WRITTEN = {
    "docs/cluster.md": "quotes a session on a SLURM cluster and what sbatch said, by hand",
}
"""Docs pages whose quoted commands are not generated samples (and why)."""
BEGIN = re.compile(r"^<!-- sample (\S+): make docs \(scripts/readme_samples\.py --write\) -->$")
END = "<!-- end of sample -->"
CAPTURED = re.compile(r"^<!-- captured \d{4}-\d{2}-\d{2}, commit [0-9a-f]{7,40}: .+ -->$")
"""A block that cannot be regenerated cheaply (a live training run) says so and whence."""


def pages() -> list[Path]:
    """The pages that hold samples or may quote a command: README.md and docs/*.md, but
    `HAND_WRITTEN`."""
    docs = sorted((ROOT / "docs").glob("*.md"))
    return [README] + [p for p in docs if p.relative_to(ROOT).as_posix() not in HAND_WRITTEN]


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else str(page)


CPUS = 2
MEMORY_TOTAL = 25_276_518_400  # bytes: this project's machine, as psutil reports it
TIMEOUT_S = 900  # a sample that compiles takes 20 to 70 s on this machine


@dataclasses.dataclass(frozen=True)
class Machine:
    """What a sample's commands see: GPUs (name, GiB) through a fake NVML, or none, and
    whether this Python's JAX seems to have a CUDA plugin (a fake, empty one)."""

    gpus: tuple[tuple[str, float], ...] = ()
    cuda_plugin: bool = False


H100 = "NVIDIA H100 80GB HBM3"
NO_GPU = Machine()
H100_CPU_JAX = Machine(gpus=((H100, 80),))
H100_CUDA_JAX = Machine(gpus=((H100, 80),), cuda_plugin=True)
FOUR_H100_CUDA_JAX = Machine(gpus=((H100, 80),) * 4, cuda_plugin=True)


@dataclasses.dataclass(frozen=True)
class Sample:
    """One page's block: `commands` run in turn on `machine`, each ending with `status`."""

    commands: tuple[str, ...]
    machine: Machine = NO_GPU
    status: int = 2  # a refusal: one line, before anything starts
    show: str = ""  # a regular expression: only the lines it matches (else all)
    echo: bool = True  # `$ command` before each output
    stderr_only: bool = False  # what `make setup` shows of its chooser
    needs_isolation: bool = False  # the output says whether a network namespace can be made


LP_MAIN = "python projects/drq_v2/lp_main.py --config configs/reacher_hard_distributed.py"

SAMPLES = {
    "setup": Sample(
        ("python scripts/choose_jax_build.py",),
        status=0,
        echo=False,
        stderr_only=True,
    ),
    "refusals": Sample(
        (
            f"{LP_MAIN} --config.num_actor=8",
            f"{LP_MAIN} --config.resources.learner.device=gpu",
            f"{LP_MAIN} --config.resources.learner.gpu_memory=2",
            f"{LP_MAIN} --config.agent.batch_size=0",
        )
    ),
    "dry-run": Sample((f"{LP_MAIN} --dry_run",), status=0, needs_isolation=True),
    "cpu-jax-on-a-gpu": Sample(
        (f"{LP_MAIN} --config.resources.learner.device=gpu",), machine=H100_CPU_JAX
    ),
    "reckoning": Sample(
        (f"{LP_MAIN} --dry_run",),
        machine=H100_CUDA_JAX,
        status=0,
        show=r"^(node group |-{4}|learner |GPU memory, reckoned|  learner: |  GPU \d)",
    ),
    "reckoning-refusal": Sample(
        (f"{LP_MAIN} --config.agent.batch_size=32768 --dry_run",),
        machine=H100_CUDA_JAX,
    ),
    "data-parallel-refusal": Sample(
        (f"{LP_MAIN} '--config.resources.learner.gpus=[1,2,3]'",), machine=FOUR_H100_CUDA_JAX
    ),
}

_SITECUSTOMIZE = f'''"""scripts/readme_samples.py: psutil reports this project's machine's RAM."""
import psutil

_virtual_memory = psutil.virtual_memory


def _pinned():
    return _virtual_memory()._replace(total={MEMORY_TOTAL})


psutil.virtual_memory = _pinned
'''


def _fake_machine(machine: Machine, folder: Path) -> dict[str, str]:
    """The environment that shows `machine`: fakes first on PYTHONPATH, no nvidia-smi."""
    from tests.fake_nvidia import write_fake_cuda_plugin, write_fake_pynvml

    if machine.gpus:
        write_fake_pynvml(folder / "nvml", gpus=machine.gpus)
    else:
        write_fake_pynvml(folder / "nvml", init_error="NVML Shared Library Not Found")
    paths = [folder / "nvml"]
    if machine.cuda_plugin:
        paths.append(write_fake_cuda_plugin(folder / "plugin"))
    (folder / "ram").mkdir()
    (folder / "ram" / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    paths += [folder / "ram", ROOT]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MAGI_LP_", "XLA_", "JAX_", "CUDA_", "TF_", "MUJOCO_"))
    }
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    env["PATH"] = os.pathsep.join(  # no nvidia-smi either
        p for p in env.get("PATH", "").split(os.pathsep) if not (Path(p) / "nvidia-smi").exists()
    )
    env["PYTHONUNBUFFERED"] = "1"  # stdout and stderr in the order they were written
    return env


def _as_in_a_terminal() -> None:
    """The sample's process: on the pinned CPUs, and with SIGINT as a terminal gives it (a
    suite started in the background, `make test &`, would hand it on ignored, and the entry
    points say so in a line no sample shows)."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:CPUS])
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run(command: str, env: dict[str, str], stderr_only: bool) -> tuple[int, str]:
    argv = shlex.split(command)
    assert argv[0] == "python", command
    process = subprocess.Popen(
        [sys.executable, *argv[1:]],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL if stderr_only else subprocess.PIPE,
        stderr=subprocess.PIPE if stderr_only else subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so that a run past TIMEOUT_S is ended with what it started
        preexec_fn=_as_in_a_terminal,
    )
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise SystemExit(f"scripts/readme_samples.py: `{command}` ran past {TIMEOUT_S} s") from None
    return process.returncode, err if stderr_only else out


def unpinned(name: str) -> str:
    """Why this machine cannot give sample `name` as its page shows it, or ''."""
    import importlib.util

    from magi_lp.launch import isolation
    from magi_lp.placement.jax_build import detect_jax_build

    if importlib.util.find_spec("launchpad") is None:
        return "the samples are of the Launchpad stack (.venv, Python 3.10): run them with it"
    if len(os.sched_getaffinity(0)) < CPUS:
        return f"the samples run on {CPUS} CPUs; this process may use fewer"
    if detect_jax_build().serves_cuda:
        return "the samples are of the CPU-only JAX build (this Python's serves CUDA)"
    if SAMPLES[name].needs_isolation and not isolation.probe().available:
        return "the plan's sample comes from a machine that can make a network namespace"
    return ""


def _excerpt(lines: list[str], show: str) -> list[str]:
    if not show:
        return lines
    kept: list[str] = []
    for line in lines:
        if re.search(show, line):
            kept.append(line)
        elif not kept or kept[-1] != "...":
            kept.append("...")
    return kept


def render(name: str) -> str:
    """Sample `name`'s block as its page shows it: run now, on its pinned machine."""
    sample = SAMPLES[name]
    lines = []
    with tempfile.TemporaryDirectory(prefix="magi_lp-readme-") as folder:
        env = _fake_machine(sample.machine, Path(folder))
        for command in sample.commands:
            status, output = _run(command, env, sample.stderr_only)
            if status != sample.status:
                raise SystemExit(
                    f"scripts/readme_samples.py: `{command}` (sample {name!r}) exited "
                    f"{status}, not {sample.status}:\n{output}"
                )
            output = output.replace(folder, "<tmp>")  # the only normalisation (docstring)
            if sample.echo:
                lines.append(f"$ {command}")
            lines += _excerpt(output.rstrip("\n").splitlines(), sample.show)
    return "\n".join(lines)


def _blocks(text: str, page: str = "README.md") -> dict[str, tuple[int, int, str]]:
    """Sample name -> (first line, end line, indent) of the code block between its markers in
    page `text` (named `page` in errors)."""
    lines = text.split("\n")
    found: dict[str, tuple[int, int, str]] = {}
    for at, line in enumerate(lines):
        match = BEGIN.match(line.strip())
        if not match:
            continue
        name = match.group(1)
        if name in found:
            raise SystemExit(f"{page}: sample {name!r} is marked twice")
        if name not in SAMPLES:
            raise SystemExit(f"{page}: sample {name!r} is not in scripts/readme_samples.py")
        fence = at + 1
        end = next(i for i in range(fence + 1, len(lines)) if lines[i].strip() == "```")
        if lines[fence].strip() != "```" or lines[end + 1].strip() != END:
            raise SystemExit(
                f"{page} line {at + 1}: sample {name!r} must be one ``` block followed by {END!r}"
            )
        indent = lines[fence][: len(lines[fence]) - len(lines[fence].lstrip())]
        found[name] = (fence + 1, end, indent)
    return found


def located(among: list[Path] | None = None) -> dict[str, Path]:
    """Sample name -> the page that holds it: each sample of `SAMPLES` is marked once, in one
    of `pages()`."""
    where: dict[str, Path] = {}
    for page in pages() if among is None else among:
        for name in _blocks(page.read_text(), _name(page)):
            if name in where:
                raise SystemExit(
                    f"sample {name!r} is marked in {_name(where[name])} and in {_name(page)}"
                )
            where[name] = page
    missing = set(SAMPLES) - set(where)
    if missing:
        raise SystemExit(
            f"no page ({', '.join(_name(p) for p in pages())}) has markers for sample(s) "
            f"{', '.join(sorted(missing))}"
        )
    return where


def unmarked(text: str) -> list[str]:
    """The lines of page `text` that quote a command or an error outside a sample: a `$ `
    or `error: ` line of a code block, or `error: ` in backquotes in a sentence. A block after
    a `CAPTURED` line says where it came from instead."""
    inside, fenced, found = "", False, []
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if BEGIN.match(stripped):
            inside = "sample"
        elif CAPTURED.match(stripped):
            inside = "captured"  # the block that follows
        elif stripped == END:
            inside = ""
        elif stripped.startswith("```"):
            fenced = not fenced
            if not fenced and inside == "captured":
                inside = ""
        elif not inside and (
            stripped.startswith(("$ ", "error: ")) if fenced else "`error: " in stripped
        ):
            found.append(f"line {number}: {stripped[:80]}")
    return found


def shown(text: str, name: str) -> str:
    """Sample `name` as page `text` holds it (without the block's indent)."""
    first, end, indent = _blocks(text)[name]
    return "\n".join(line.removeprefix(indent) for line in text.split("\n")[first:end])


def write(text: str, rendered: dict[str, str]) -> str:
    """Page `text` with each rendered sample in its block (each must be in that page)."""
    lines = text.split("\n")
    blocks = _blocks(text)
    for name in sorted(rendered, key=lambda n: blocks[n][0], reverse=True):
        first, end, indent = blocks[name]
        new = [f"{indent}{line}" if line else line for line in rendered[name].split("\n")]
        lines[first:end] = new
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    flags = [a for a in argv if a.startswith("--")]
    names = [a for a in argv if not a.startswith("--")] or list(SAMPLES)
    unknown = [n for n in names if n not in SAMPLES] + [
        f for f in flags if f not in ("--write", "--check")
    ]
    if unknown:
        raise SystemExit(f"usage: readme_samples.py [--write | --check] [{' | '.join(SAMPLES)}]")
    where = located()  # every sample marked once, before minutes of running them
    if flags:
        for page in pages():
            for line in unmarked(page.read_text()):
                print(
                    f"{_name(page)} {line}: not a generated sample (add it to SAMPLES)",
                    file=sys.stderr,
                )
    rendered = {}
    for name in names:
        why = unpinned(name)
        if why:
            if "--write" in flags:
                raise SystemExit(f"scripts/readme_samples.py: cannot write {name!r}: {why}")
            print(f"sample {name}: skipped: {why}", file=sys.stderr)
            continue
        rendered[name] = render(name)
    if "--write" in flags:
        for page in sorted(set(where.values())):
            mine = {name: block for name, block in rendered.items() if where[name] == page}
            if mine:
                page.write_text(write(page.read_text(), mine))
        return 0
    if "--check" in flags:
        differ = 0
        for name, block in rendered.items():
            text = where[name].read_text()
            if block != shown(text, name):
                differ += 1
                sys.stdout.writelines(
                    difflib.unified_diff(
                        shown(text, name).splitlines(True),
                        block.splitlines(True),
                        f"{_name(where[name])} (sample {name})",
                        "what it prints now",
                    )
                )
                print()
        if differ:
            print(f"{differ} sample(s) differ: run `make docs` and commit the pages")
        return 1 if differ else 0
    for name, block in rendered.items():
        print(f"--- {name} ({_name(where[name])})\n{block}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
