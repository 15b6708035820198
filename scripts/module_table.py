"""Prints docs/architecture.md's module table: each magi_lp module and its docstring's first line.

The table only points at the modules' own docstrings (which say the rest), so it cannot drift
from them: tests/test_architecture_doc.py checks that the doc holds exactly this table.

    python scripts/module_table.py            # print it
    python scripts/module_table.py --write    # replace the table in docs/architecture.md
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- module table: scripts/module_table.py --write -->"
END = "<!-- end of module table -->"


def first_line(path: Path) -> str:
    """The first sentence-line of a module's docstring (the one that says its job)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    lines = []
    for line in doc.strip().splitlines():
        if not line.strip():
            break
        lines.append(line.strip())
    return " ".join(lines).replace("|", "\\|")


def table() -> str:
    rows = ["| module | what it is for (its docstring says the rest) |", "| --- | --- |"]
    for path in sorted((ROOT / "magi_lp").rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py") and path.parent.name != "cluster":
            continue
        if path.name == "__main__.py":
            continue
        name = path.relative_to(ROOT / "magi_lp").as_posix()
        rows.append(f"| `{name}` | {first_line(path)} |")
    return "\n".join(rows)


def main() -> int:
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    if "--write" in sys.argv:
        DOC.write_text(text[:start] + "\n" + table() + "\n" + text[end:])
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
