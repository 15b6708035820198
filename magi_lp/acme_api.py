"""Acme's interfaces (dm-acme 0.4.0), importable with or without Launchpad installed.

Acme's actor, learner, adder, counter, logger and environment-spec types are this
toolkit's contract: an Acme component plugs into it, and its agents are Acme agents. But
`acme/__init__.py` imports the environment loop, which imports `acme.utils.signals`, which
runs `import launchpad`; on a stack without Launchpad (Python 3.12 and current JAX, where
Launchpad and Reverb have no wheels) not one `acme` module imports. The modules this
toolkit uses import nothing heavier than dm_env, dm-tree and NumPy, so:

- where Launchpad is installed, this module is `import acme` as it is;
- where it is not, acme's package `__init__` files are skipped: `acme` and its subpackages
  are registered as bare packages over the installed dm-acme, the leaf modules below are
  loaded from it, and each bare package gets the names its own `__init__` would export.

Either way the classes are acme's own (`acme_api.core.Actor is acme.core.Actor` where both
import), so code written against Acme runs on both stacks. Import Acme's types from here,
never from `acme` directly (`lint-imports` keeps it so), except in modules that need
Launchpad or Reverb anyway (`acme.adders.reverb`, `acme.datasets`).

This is the one place of the dm-acme 0.4.0 internals magi_lp relies on. Each, with what
breaks if an upgrade changes it:

- The module layout of `_EXPORTS` below (`acme.specs`, `acme.types`, `acme.core`,
  `acme.adders.base`, `acme.utils.counting`, `acme.utils.loggers.*`, `acme.wrappers.*`) and
  that those leaves import nothing that needs Launchpad: the bare load registers the packages
  and imports them one by one. If it changes: `import magi_lp.acme_api` fails on the current
  stack (Python 3.12), with the missing module's name; the Launchpad stack is unaffected.
- That `import acme` fails with `ModuleNotFoundError` naming `launchpad` where Launchpad is
  missing (`_acme_imports_whole`). If it changes (another missing module first): that error
  is raised as it is, not papered over.
- `acme.wrappers.single_precision._convert_value`, replaced under NumPy >= 2
  (`_fix_single_precision_for_numpy2`): dm-acme 0.4.0 converts with `np.array(x,
  copy=False)`, which NumPy 2 refuses for float64 input. If it changes: the import fails
  under NumPy 2 with one RuntimeError naming the attribute (check the new conversion).
- `acme.adders.reverb.base.ReverbAdder`'s private trajectory writer (`_ReverbAdder__writer`),
  closed by `close_reverb_adder`: Acme's `reset()` keeps a writer younger than 60 s open, and
  a Reverb server does not stop while a writer is connected (it waits 5 s for it: every
  single-process run on a Reverb replay ended 5 s late). If it changes: one RuntimeError
  naming the attribute when a run ends.

Exercised by tests/test_acme_seam.py on both stacks (the bare load on Python 3.12, the
NumPy 2 conversion) and by every test that imports Acme's types.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types as _module_types

# Leaf modules loaded in bare mode, and the names each bare package re-exports from them
# (as its `__init__` in dm-acme 0.4.0 does, for the modules that import without Launchpad).
_EXPORTS: dict[str, dict[str, tuple[str, ...]]] = {
    "acme": {
        "acme.specs": ("make_environment_spec",),
        "acme.types": (),
        "acme.core": ("Actor", "Learner", "Saveable", "VariableSource", "Worker"),
    },
    "acme.adders": {"acme.adders.base": ("Adder",)},
    "acme.utils": {"acme.utils.counting": ()},
    "acme.utils.loggers": {
        "acme.utils.loggers.base": ("Logger", "LoggingData", "NoOpLogger", "to_numpy"),
        "acme.utils.loggers.aggregators": ("Dispatcher",),
        "acme.utils.loggers.filters": ("GatedFilter", "KeyFilter", "NoneFilter", "TimeFilter"),
        "acme.utils.loggers.terminal": ("TerminalLogger",),
    },
    "acme.wrappers": {
        "acme.wrappers.base": ("EnvironmentWrapper", "wrap_all"),
        "acme.wrappers.action_repeat": ("ActionRepeatWrapper",),
        "acme.wrappers.canonical_spec": ("CanonicalSpecWrapper",),
        "acme.wrappers.concatenate_observations": ("ConcatObservationWrapper",),
        "acme.wrappers.single_precision": ("SinglePrecisionWrapper",),
        "acme.wrappers.step_limit": ("StepLimitWrapper",),
    },
}


def _load_bare() -> None:
    """Registers acme's packages without running their `__init__`, then loads the leaves."""
    found = importlib.util.find_spec("acme")  # finds the package without importing it
    if found is None or not found.submodule_search_locations:
        raise ImportError(
            "dm-acme is not installed: install it without its dependencies "
            "(`pip install --no-deps dm-acme==0.4.0`; its requirements pin dm-launchpad), "
            "as scripts/setup_venv.sh does for each stack"
        )
    root = next(iter(found.submodule_search_locations))
    for package in _EXPORTS:
        path = os.path.join(root, *package.split(".")[1:])
        spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
        spec.submodule_search_locations = [path]
        module = _module_types.ModuleType(package, f"{package} (magi_lp.acme_api: bare)")
        module.__path__ = [path]
        module.__spec__ = spec
        module.__package__ = package
        sys.modules[package] = module
        parent, _, child = package.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
    for package, leaves in _EXPORTS.items():
        for leaf, names in leaves.items():
            module = importlib.import_module(leaf)
            for name in names:
                setattr(sys.modules[package], name, getattr(module, name))


def _acme_imports_whole() -> bool:
    """Imports `acme` as it is; False where that fails only for want of Launchpad."""
    try:
        importlib.import_module("acme")
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "launchpad":
            raise  # a broken install of something else: say so, do not paper over it
        # The leaves imported before the failure are dropped: the bare load owns them.
        for name in [name for name in sys.modules if name.split(".")[0] == "acme"]:
            del sys.modules[name]
        return False
    return True


BARE = not _acme_imports_whole()
"""True where Launchpad is missing and acme's leaf modules were loaded without its package."""

if BARE:
    _load_bare()

# Bound here so that every user reads them from one place; the same objects either way.
from acme import adders, core, specs, types, wrappers  # noqa: E402
from acme.utils import counting, loggers  # noqa: E402

__all__ = [
    "BARE",
    "adders",
    "close_reverb_adder",
    "core",
    "counting",
    "loggers",
    "specs",
    "types",
    "wrappers",
]


def _fix_single_precision_for_numpy2() -> None:
    """dm-acme 0.4.0's `SinglePrecisionWrapper` converts with `np.array(x, copy=False,
    dtype=np.float32)`, which NumPy 2 refuses for float64 input ("Unable to avoid copy").
    Its converter is replaced by the same conversion through `np.asarray` (NumPy 1's meaning
    of `copy=False`); nothing changes under NumPy 1 (the Launchpad stack)."""
    import numpy as np
    import tree
    from acme.wrappers import single_precision

    if int(np.__version__.split(".")[0]) < 2:
        return
    if not hasattr(single_precision, "_convert_value"):
        raise RuntimeError(
            "acme.wrappers.single_precision no longer has _convert_value; magi_lp supports "
            "dm-acme 0.4.0 (magi_lp/acme_api.py lists what it relies on)."
        )

    def convert_value(nested_value):
        def convert(value):
            if value is None:
                return value
            value = np.asarray(value)
            if np.issubdtype(value.dtype, np.float64):
                return value.astype(np.float32)
            if np.issubdtype(value.dtype, np.int64):
                return value.astype(np.int32)
            return value

        return tree.map_structure(convert, nested_value)

    single_precision._convert_value = convert_value


_fix_single_precision_for_numpy2()


_REVERB_ADDER = ("acme.adders.reverb.base", "ReverbAdder")
_REVERB_ADDER_WRITER = "_ReverbAdder__writer"


def close_reverb_adder(adder: object) -> bool:
    """Ends the episode of an Acme Reverb adder (its `reset()`, which flushes what it holds)
    and closes its trajectory writer, so the server it writes to can stop at once. Returns
    False, doing nothing, for an adder of another kind. The adder stays usable: Acme opens a
    new writer at its next write."""
    if not any((c.__module__, c.__name__) == _REVERB_ADDER for c in type(adder).__mro__):
        return False
    if not hasattr(adder, _REVERB_ADDER_WRITER):
        raise RuntimeError(
            f"acme's ReverbAdder no longer has {_REVERB_ADDER_WRITER}; magi_lp supports "
            "dm-acme 0.4.0 (magi_lp/acme_api.py lists what it relies on)."
        )
    adder.reset()  # type: ignore[attr-defined]
    writer = getattr(adder, _REVERB_ADDER_WRITER)
    if writer is not None:
        writer.close()
        setattr(adder, _REVERB_ADDER_WRITER, None)
    return True
