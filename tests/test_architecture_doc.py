"""docs/architecture.md's module table is the modules' own first docstring lines, all of them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module_table():
    spec = importlib.util.spec_from_file_location("module_table", ROOT / "scripts/module_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_doc_holds_the_table_of_every_module():
    module_table = _module_table()
    doc = module_table.DOC.read_text()
    table = module_table.table()
    assert f"{module_table.BEGIN}\n{table}\n{module_table.END}" in doc, (
        "docs/architecture.md's module table is out of date: run `make docs` "
        "(python scripts/module_table.py --write)"
    )
    listed = {line.split("`")[1] for line in table.splitlines()[2:]}
    on_disk = {
        p.relative_to(ROOT / "magi_lp").as_posix()
        for p in (ROOT / "magi_lp").rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    }
    assert on_disk <= listed
    assert all(line.split("|")[2].strip() for line in table.splitlines()[2:]), (
        "a module without a docstring"
    )
