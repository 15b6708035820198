"""Every `ConfigError` a user can meet is worded by config_schema's named shapes.

`refusal(key, allowed, value, fix)`: "<key> must be <allowed>, got <value>; <fix>", for one
key's value; `fact_refusal(what, facts, fix)`: "<what>: <facts>; <fix>", for a refusal that is
not about one key's value; `refusal_at(place, error)`: such a refusal said of one host. The
test reads the sources (`ast`), not the messages: every `ConfigError(...)` in magi_lp/ and
projects/ must take a call to one of the shapes, or a name assigned from one in the same
function, so a new raise with its own f-string fails here, naming its file and line.
"""

from __future__ import annotations

import ast
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Literal

import pytest

from magi_lp.config_schema import fact_refusal, refusal, refusal_at
from magi_lp.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("magi_lp", "projects")
SHAPES = {"refusal", "fact_refusal", "refusal_at"}
"""config_schema's functions that word a refusal."""

PENDING: dict[str, int] = {}
"""ConfigErrors still made from their own text, per module: those issue 33 did not list (it
asked for the plan, the host plan, resource_spec, the logger and the checkpointer). Word one
with a shape and lower its count here; never raise a count or add a module."""


def _name(node: ast.expr) -> str | None:
    """`f` for `f` and `a.b.f`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _assigned(scope: ast.AST, name: str) -> list[ast.expr]:
    """The values assigned to `name` in `scope` (not in functions nested in it)."""
    values = []
    for node in _walk_scope(scope):
        if isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                values.append(node.value)
        elif (
            isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
        ):
            values.append(node.value)
    return values


def _walk_scope(scope: ast.AST):
    """The nodes of `scope`'s body, not descending into nested functions or classes."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))


def _shaped(node: ast.expr | None, scope: ast.AST, depth: int = 0) -> bool:
    """Whether `node` is a call to a shape, or a name only ever assigned from one."""
    if node is None or depth > 3:
        return False
    if isinstance(node, ast.Call) and _name(node.func) in SHAPES:
        # fact_refusal's fix is never empty: a refusal says what to change.
        fix = node.args[2] if _name(node.func) == "fact_refusal" and len(node.args) > 2 else None
        return not (isinstance(fix, ast.Constant) and not fix.value)
    if isinstance(node, ast.Name):
        values = _assigned(scope, node.id)
        return bool(values) and all(_shaped(v, scope, depth + 1) for v in values)
    return False


def _error_classes(trees: dict[str, ast.Module]) -> set[str]:
    """ConfigError and its subclasses, by name."""
    names = {"ConfigError"}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(_name(b) in names for b in node.bases):
                names.add(node.name)
    return names


def unshaped_sites(trees: dict[str, ast.Module]) -> list[tuple[str, int, str, str]]:
    """(path, line, "Class.function", source) of every ConfigError made from its own text.

    A subclass of ConfigError is made from structured arguments; its own `super().__init__`
    must take a shape instead.
    """
    classes = _error_classes(trees)
    found = []
    for path, tree in trees.items():
        for scope, qualname in _scopes(tree):
            for node in _walk_scope(scope):
                if not isinstance(node, ast.Call):
                    continue
                name = _name(node.func)
                in_subclass = qualname.endswith(".__init__") and qualname.split(".")[0] in classes
                if name == "ConfigError" or (
                    name == "__init__"
                    and in_subclass
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Call)
                    and _name(node.func.value.func) == "super"
                ):
                    argument = node.args[0] if node.args else None
                    if not _shaped(argument, scope):
                        found.append((path, node.lineno, qualname, ast.unparse(node)))
    return found


def _scopes(tree: ast.Module):
    """(scope, "Class.function") for the module and every function in it."""
    yield tree, "<module>"
    stack: list[tuple[ast.AST, str]] = [(tree, "")]
    while stack:
        parent, prefix = stack.pop()
        for node in ast.iter_child_nodes(parent):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                qualname = f"{prefix}{node.name}"
                if not isinstance(node, ast.ClassDef):
                    yield node, qualname
                stack.append((node, f"{qualname}."))
            else:
                stack.append((node, prefix))


def _sources() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(ROOT)): ast.parse(path.read_text(), str(path))
        for root in SOURCES
        for path in sorted((ROOT / root).rglob("*.py"))
    }


def test_every_config_error_is_worded_by_a_shape():
    sites = unshaped_sites(_sources())
    counts = Counter(path for path, _, _, _ in sites)
    new = [
        f"{path}:{line} ({qualname}): {text}"
        for path, line, qualname, text in sites
        if counts[path] > PENDING.get(path, 0)
    ]
    assert not new, (
        "a ConfigError writes its own text; word it with config_schema.refusal(key, allowed, "
        "value, fix) or fact_refusal(what, facts, fix):\n" + "\n".join(new)
    )
    done = {path: counts[path] for path, n in PENDING.items() if counts[path] < n}
    assert not done, f"fewer free-form ConfigErrors than PENDING says; set them to: {done}"


@pytest.mark.parametrize(
    ("body", "shaped"),
    [
        ('raise ConfigError(f"{key} is wrong")', False),
        ("raise ConfigError()", False),
        ("raise ConfigError(message)", False),  # assigned nowhere in the function
        ('raise ConfigError(refusal(key, "an integer", value, "e.g. 1"))', True),
        ('raise errors.ConfigError(config_schema.fact_refusal("a", "b", "c"))', True),
        ('raise ConfigError(fact_refusal("a", "b", ""))', False),  # no fix
        ('message = fact_refusal("a", "", "c")\n    raise ConfigError(message)', True),
        ('message = f"{key}"\n    raise ConfigError(message)', False),
        ('raise ConfigError(refusal_at("host a1", error)) from None', True),
        ("return ConfigError(str(error))", False),  # made, not raised: still a refusal
    ],
)
def test_the_walk_tells_a_shaped_refusal_from_free_text(body, shaped):
    tree = ast.parse(f"def check(key, value, error):\n    {body}\n")
    assert (unshaped_sites({"example.py": tree}) == []) is shaped


def test_a_subclass_words_its_message_by_a_shape_too():
    tree = ast.parse(
        "class Bad(ConfigError):\n"
        "    def __init__(self, key):\n"
        '        super().__init__(f"{key} is bad")\n'
        "class Good(ConfigError):\n"
        "    def __init__(self, key):\n"
        '        super().__init__(refusal(key, "x", 1))\n'
    )
    assert [site[2] for site in unshaped_sites({"example.py": tree})] == ["Bad.__init__"]


def test_the_shapes_read_as_one_line_with_the_key_and_the_fix():
    assert refusal("logging.time_delta", ">= 0 seconds", -1, "0 keeps every row") == (
        "logging.time_delta must be >= 0 seconds, got -1; 0 keeps every row"
    )
    assert fact_refusal(
        "GPU 3 is not on this machine", "the GPUs present are 0, 1", "use ids from that list"
    ) == ("GPU 3 is not on this machine: the GPUs present are 0, 1; use ids from that list")
    assert fact_refusal("hosts.machines is empty", "", "name one") == (
        "hosts.machines is empty; name one"
    )
    inner = ConfigError(refusal("resources.learner.gpus", "at most 2", 3, "ask for 2"))
    assert refusal_at("host a1", inner) == (
        "host a1: resources.learner.gpus must be at most 2, got 3; ask for 2"
    )


@dataclasses.dataclass(frozen=True)
class _ChoiceSettings:
    mode: Literal["fast", "exact"] = "fast"
    sizes: tuple[int, ...] | None = (2, 3)


@dataclasses.dataclass(frozen=True)
class _BareSettings:
    hidden_sizes: tuple = (256, 256)


def test_a_literal_field_takes_its_words_and_an_undeclarable_type_is_named():
    """A new project's settings: `Literal` is a choice; a bare `tuple` (no item type) made
    the project's own default fail in a line that contradicted itself."""
    from magi_lp.config_schema import as_config, typed_section

    assert typed_section(_ChoiceSettings, as_config(_ChoiceSettings()), "agent.").mode == "fast"
    with pytest.raises(ConfigError) as refused:
        typed_section(
            _ChoiceSettings, {"mode": "slow", "sizes": None}, "agent.", suggest_defaults=True
        )
    assert str(refused.value) == (
        "agent.mode must be one of 'fast', 'exact', got 'slow'; e.g. "
        "--config.agent.mode='fast' (the default)"
    )
    with pytest.raises(TypeError) as bare:
        typed_section(_BareSettings, as_config(_BareSettings()), "agent.")
    assert str(bare.value).startswith(
        "_BareSettings.hidden_sizes (agent.hidden_sizes) is declared as <class 'tuple'>, a "
        "type a config key cannot be checked against: declare bool, int, float, str,"
    )
