"""The one engine registry (`magi_lp.engines.REGISTRY`): every way to run is an engine behind
`run(Launch) -> int`, and what users read of the engines is derived from it."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

from absl import flags

from magi_lp import engines
from magi_lp.stack import STACKS, stack_here

ROOT = Path(__file__).resolve().parents[1]


def _module_file(module: str) -> Path:
    return ROOT / (module.replace(".", "/") + ".py")


def test_every_engine_module_has_run_of_a_launch():
    """Read from the source (an engine's module imports its library: Launchpad or Ray)."""
    for (name, stack), engine in engines.REGISTRY.items():
        tree = ast.parse(_module_file(engine.module).read_text())
        runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
        assert runs, f"{name} on {stack}: {engine.module} has no run()"
        args = runs[0].args.args
        assert [a.arg for a in args] == ["launch"], (name, stack)
        assert ast.unparse(runs[0].returns) == "int", (name, stack)
        assert stack in STACKS


def test_the_registry_holds_each_launcher_per_stack_and_the_single_process_engine():
    keys = set(engines.REGISTRY)
    assert ("local", "launchpad") in keys and ("ray", "ray") in keys
    for launcher in ("slurm", "kubernetes"):
        assert {(launcher, "launchpad"), (launcher, "ray")} <= keys
    assert {(engines.SINGLE_PROCESS, stack) for stack in STACKS} <= keys
    assert engines.SINGLE_PROCESS not in engines.launchers()
    assert engines.several_hosts_launchers() == ["hosts", "slurm", "kubernetes"]


def test_the_engine_of_this_stack_is_chosen_and_another_stacks_says_what_runs_here():
    here = stack_here()
    assert engines.engine(None).stack == here
    for name in engines.launchers():
        chosen = engines.engine(name)
        assert chosen.name == name
        if (name, here) in engines.REGISTRY:
            assert chosen.stack == here
    other = "local" if here == "ray" else "ray"
    assert engines.engine(other).stack != here
    assert engines.engine(other).missing()


def test_the_launcher_flag_is_read_from_the_registry():
    import magi_lp.cli  # noqa: F401  (defines the flags)

    flag = flags.FLAGS["launcher"]
    assert list(flag.parser.enum_values) == engines.launchers()
    for name in engines.launchers():
        assert f"{name}: {engines.engine(name).summary}" in flag.help


def test_the_readme_engine_table_names_every_launcher_and_no_other():
    text = (ROOT / "README.md").read_text()
    table = text.split("| `--launcher` |", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"^\| ([^|]+) \|", table, flags=re.M))
    cells = {n for row in named for n in re.findall(r"`([a-z_]+)`", row)}
    assert cells == set(engines.launchers())


def test_the_cluster_engines_are_the_registrys():
    if importlib.util.find_spec("ml_collections") is None:  # pragma: no cover
        return
    from magi_lp.cluster import engines as cluster_engines

    several = {key: e for key, e in engines.REGISTRY.items() if e.cluster_engine is not None}
    assert set(cluster_engines._ENGINES) == set(several)
    for (name, stack), engine in several.items():
        made = cluster_engines._ENGINES[(name, stack)]
        assert type(made).__name__ == engine.cluster_engine
        assert (made.launcher, made.runtime) == (name, stack)
