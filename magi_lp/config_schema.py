"""Config sections declared as typed dataclasses, and their one-line checks.

Every section of an experiment config, the toolkit's (`magi_lp.runtime.config`) and an
agent's (`config.agent`, `config.env`, in the project's `config.py`), is declared once as a
frozen dataclass: each field is a key with its type and default, and `__post_init__`
checks ranges. `typed_section(cls, values, prefix)` checks a ConfigDict against it, so a
typo, a missing key, a wrong type or a value out of range is refused before any process
starts, with one line naming the key by its full name. Every refused value has one shape
(`refusal`): the key in full, what is allowed, the value given, then the fix where there is
one. A refusal that is not about one key's value (a plan that does not fit the machine, two
settings that contradict each other, a name that is not there) has the second shape
(`fact_refusal`): what is refused, the facts that rule it out, the fix. Every `ConfigError`
in magi_lp and the projects is worded by one of the two (tests/test_config_errors.py):

    @dataclasses.dataclass(frozen=True)
    class TD3Settings:
        batch_size: int = 256
        hidden_sizes: tuple[int, ...] = (256, 256)

        def __post_init__(self) -> None:
            in_range(self, "batch_size", minimum=1)

    agent = as_config(TD3Settings())  # the defaults, each overridable on the command line
    typed_section(TD3Settings, agent, "agent.", suggest_defaults=True)
    # error: agent.batch_size must be an integer >= 1, got 0; e.g.
    #        --config.agent.batch_size=256 (the default)

Field types: bool, int, float, str, `Literal["a", "b"]` (one of those values), unions of
them (`int | None`), `tuple[int, ...]` (a list or tuple on the command line; its items one
of the four) and a nested dataclass (a sub-section, checked under
`<prefix><field>.`). A field declared with `allowed(words, default=...)` takes any value
its `__post_init__` accepts (e.g. `"auto"`, a count or a list of ids; `magi_lp.placement.
resources.ResourceSpec`): it checks the type itself, and `check` refuses it in those words.
Imports only the standard library, ml_collections and `magi_lp.errors`: the entry points
check a config before importing JAX or TensorFlow. ml_collections only where a section is
made or checked, so that the shapes word a refusal in a bare Python too (the network
isolation's, `magi_lp.launch.isolation`, which runs in one: tests/test_isolation.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from magi_lp.errors import ConfigError

if TYPE_CHECKING:
    import ml_collections

EXPERIMENT_DEFAULTS = "magi_lp.runtime.config.experiment_defaults()"
"""Where a complete toolkit config comes from (the default advice for a missing key)."""


_ALLOWED = "magi_lp.allowed"  # the field metadata key of `allowed`'s words
_FIELD = object()  # `check`'s value: the field's own


def refusal(key: str, allowed: str, value: Any, fix: str = "") -> str:
    """The one shape of a refused config value: "<key> must be <allowed>, got <value>", then
    "; <fix>" where there is one, else "." (`key` in full: "resources.learner.gpus")."""
    return f"{key} must be {allowed}, got {value!r}" + (f"; {fix}" if fix else ".")


def fact_refusal(what: str, facts: str, fix: str) -> str:
    """The second shape, for a refusal that is not about one key's value: "<what>: <facts>;
    <fix>", e.g. "GPU 3 is not on this machine: GPUs present are 0, 1; use ids from that
    list". `what` names the setting(s) in full, `facts` what rules it out ("" when `what`
    says it all: "<what>; <fix>"), `fix` what to change (never empty)."""
    return f"{what}: {facts}; {fix}" if facts else f"{what}; {fix}"


def refusal_at(place: str, error: ConfigError) -> str:
    """`error`, a refusal in one of the two shapes, said of one `place` of several (a host of
    the cluster): "host a1: <error>"."""
    return f"{place}: {error}"


def did_you_mean(name: str, known: Iterable[str], *, prefix: str = "", otherwise: str) -> str:
    """The fix for `name`, which is not among `known`: "did you mean <prefix><closest>?", or
    `otherwise` where none is close."""
    close = difflib.get_close_matches(str(name), sorted(known), n=1)
    return f"did you mean {prefix}{close[0]}?" if close else otherwise


def not_among(
    what: str,
    name: str,
    known: Sequence[str],
    listed: str,
    *,
    prefix: str = "",
    otherwise: str = "use one of those",
) -> ConfigError:
    """The refusal of `name`, which is not among `known`: "<what>: <listed> are <known, ...>;
    did you mean <prefix><closest>?", or `otherwise` where none is close (`listed`: how the
    list is named, e.g. "the hosts")."""
    fix = did_you_mean(name, known, prefix=prefix, otherwise=otherwise)
    return ConfigError(fact_refusal(what, f"{listed} are {', '.join(known)}", fix))


def fail_unless(ok: bool, key: str, allowed: str, value: Any, fix: str = "") -> None:
    """Refuses `value` unless `ok`, as `refusal` words it (key in full)."""
    if not ok:
        raise ConfigError(refusal(key, allowed, value, fix))


class OutOfRangeError(ConfigError):
    """A field's value is out of its range; `typed_section` names it in full, with the fix.

    `key` is the field ("gpus") or an item below it ("env.SEED"); `owner` the class, which
    names the key where the settings were made directly, not from a config section."""

    def __init__(self, key: str, allowed: str, value: Any, fix: str = "", owner: str = ""):
        super().__init__(refusal(f"{owner}.{key}" if owner else key, allowed, value, fix))
        self.key, self.allowed, self.value, self.fix = key, allowed, value, fix


def allowed(words: str, **field_kwargs: Any) -> Any:
    """A dataclass field whose values `words` describe ("'auto', a count >= 1, or a list of
    GPU ids"): declared once, used by every refusal of the field. Its `__post_init__` checks
    its type too (`typed_section` leaves that to it), so it may take values of several kinds.
    `field_kwargs` as for `dataclasses.field` (`default=...`)."""
    return dataclasses.field(metadata={_ALLOWED: words}, **field_kwargs)


def choices(options: Iterable[Any]) -> str:
    """The words for a field that takes one of `options`: "one of 'cpu', 'gpu'"."""
    return "one of " + ", ".join(repr(option) for option in options)


def is_int(value: Any) -> bool:
    """Whether `value` is an int (bool is an int subclass, but `gpus=True` is a mistake, not
    the count 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_one_of(value: Any, options: Iterable[Any]) -> bool:
    """Whether `value` is one of `options` (True is never 1)."""
    return not isinstance(value, bool) and value in tuple(options)


def check(
    settings: Any,
    key: str,
    ok: bool,
    allowed: str | None = None,
    *,
    fix: str = "",
    value: Any = _FIELD,
) -> None:
    """In `__post_init__`: refuses field `key` of `settings` unless `ok` ("must be <allowed>";
    by default the words its `allowed` declaration gives), with `fix` where there is one.
    `key` may name an item below the field ("env.SEED"); `value` is then that item."""
    if ok:
        return
    field = key.split(".", 1)[0]
    if allowed is None:
        allowed = {f.name: f for f in dataclasses.fields(settings)}[field].metadata[_ALLOWED]
    value = getattr(settings, field) if value is _FIELD else value
    raise OutOfRangeError(key, allowed, value, fix, owner=type(settings).__name__)


def in_range(
    settings: Any,
    key: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
) -> None:
    """In `__post_init__`: field `key` is a finite number within the bounds (`above` and
    `below` are strict), or, for a `tuple[int, ...]` field, a non-empty sequence of them."""
    value = getattr(settings, key)
    bounds = " and ".join(
        f"{word} {bound}"
        for word, bound in ((">", above), (">=", minimum), ("<", below), ("<=", maximum))
        if bound is not None
    )

    def ok(number: Any) -> bool:
        return (
            math.isfinite(number)
            and (minimum is None or number >= minimum)
            and (maximum is None or number <= maximum)
            and (above is None or number > above)
            and (below is None or number < below)
        )

    annotation = typing.get_type_hints(type(settings))[key]
    if _sequence_item(annotation) is not None:
        words = f"a non-empty list of {_PLURAL_WORDS[_sequence_item(annotation)]} {bounds}"
        check(settings, key, bool(value) and all(map(ok, value)), words)
    else:
        check(settings, key, ok(value), f"{_TYPE_WORDS[annotation]} {bounds}".strip())


def as_config(settings: Any) -> ml_collections.ConfigDict:
    """A dataclass instance as a config section (nested dataclasses as sub-sections), so
    that every key can be overridden with `--config.<section>.<key>=`."""
    import ml_collections

    return ml_collections.ConfigDict(dataclasses.asdict(settings))


def unknown_key(prefix: str, key: str, known: Iterable[str]) -> ConfigError:
    """The error for a key the section does not have, with the closest known one."""
    what = f"{prefix}{key} is not a known config key"
    return not_among(what, key, sorted(known), "the known keys", prefix=prefix)


def missing_key(prefix: str, key: str, start_from: str = EXPERIMENT_DEFAULTS) -> ConfigError:
    """The error for a key the section lacks, with where a complete section comes from."""
    return ConfigError(fact_refusal(f"{prefix}{key} is missing", "", f"start from {start_from}"))


def check_keys(
    section: Iterable[str],
    prefix: str,
    known: Iterable[str],
    *,
    required: Iterable[str] = (),
    start_from: str = EXPERIMENT_DEFAULTS,
) -> None:
    """Refuses the first key of `section` that is not `known` (`unknown_key`), then the first
    `required` key it lacks (`missing_key`); `prefix` is the section's path ("hosts.")."""
    known = set(known)
    keys = list(section)
    for key in keys:
        if key not in known:
            raise unknown_key(prefix, key, known)
    for key in required:
        if key not in keys:
            raise missing_key(prefix, key, start_from)


def _sequence_item(annotation: Any) -> Any:
    """The item type of `tuple[X, ...]` / `list[X]`, else None."""
    if typing.get_origin(annotation) in (tuple, list):
        return typing.get_args(annotation)[0]
    return None


def _literal_options(annotation: Any) -> tuple[Any, ...] | None:
    """The options of `Literal["a", "b"]`, else None."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return None


def _declarable(annotation: Any) -> bool:
    """Whether a field of this type can be checked (the module docstring's field types)."""
    if annotation in _TYPE_WORDS or _literal_options(annotation) is not None:
        return True
    item = _sequence_item(annotation)
    if item is not None:
        return item in _TYPE_WORDS
    args = typing.get_args(annotation)  # a union: each of its types, or None
    return bool(args) and all(arg is type(None) or _declarable(arg) for arg in args)


def _check_declared(cls: type, name: str, annotation: Any, key: str) -> None:
    """Refuses a settings field whose type no value could pass: a project's bug, named
    where it is (before, the project's own default was refused in a line that contradicted
    itself: `must be <class 'tuple'>, got (256, 256)`)."""
    if dataclasses.is_dataclass(annotation) or _declarable(annotation):
        return
    raise TypeError(
        f"{cls.__name__}.{name} ({key}) is declared as {annotation!r}, a type a config key "
        "cannot be checked against: declare bool, int, float, str, Literal['a', 'b'], "
        "tuple[int, ...] (or of another of those), a union of them with None, or a nested "
        "settings dataclass (magi_lp.config_schema)"
    )


def _type_ok(value: Any, annotation: Any) -> bool:
    options = _literal_options(annotation)
    if options is not None:
        return is_one_of(value, options)
    if annotation is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False  # True is an int to Python, never to a config
    if annotation is int:
        return isinstance(value, int)
    if annotation is float:
        return isinstance(value, int | float)
    if annotation is str:
        return isinstance(value, str)
    item = _sequence_item(annotation)
    if item is not None:
        return isinstance(value, tuple | list) and all(_type_ok(v, item) for v in value)
    return any(_type_ok(value, arg) for arg in typing.get_args(annotation)) or (
        value is None and type(None) in typing.get_args(annotation)
    )


_TYPE_WORDS = {bool: "True or False", int: "an integer", float: "a number", str: "a string"}
_PLURAL_WORDS = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


def _describe(annotation: Any) -> str:
    if annotation in _TYPE_WORDS:
        return _TYPE_WORDS[annotation]
    options = _literal_options(annotation)
    if options is not None:
        return choices(options)
    item = _sequence_item(annotation)
    if item is not None:
        return f"a list of {_PLURAL_WORDS.get(item, str(item))}"
    words = ["None" if arg is type(None) else _describe(arg) for arg in typing.get_args(annotation)]
    return " or ".join(words) or str(annotation)


def flag_value(value: Any) -> str:
    """A config value (a default, a saved one) as one shell word after `--config.<key>=`:
    (256,256), not (256, 256) or [256, 256]."""
    if isinstance(value, tuple | list):
        items = ",".join(flag_value(v) for v in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    return repr(value)


def override_refusal(key: str, given: str, current: Any) -> str:
    """The refusal of `--config.<key>=<given>` that the flag parser could not read as the
    kind of value `current` (the key's value in the config file) is: "<key> must be an
    integer, got '1.5'; e.g. --config.<key>=100000 (the config file's value)"."""
    import ml_collections

    if isinstance(current, Mapping | ml_collections.ConfigDict):
        if not current:  # a mapping the file leaves empty (resources.<group>.env): no key to set
            return refusal(
                key,
                "a mapping set in the config file",
                given,
                f"set it there, e.g. config.{key} = {{'NAME': 'value'}} (command-line overrides "
                "can only change keys the file sets)",
            )
        inner = "device" if "device" in current else next(iter(current), "<key>")
        return refusal(
            key,
            "a section, set one key at a time",
            given,
            f"e.g. --config.{key}.{inner}=... (its keys: {', '.join(current)})",
        )
    if isinstance(current, tuple | list):
        words = "a list, e.g. (1,2) or (1,) (no spaces)"
    else:
        words = _TYPE_WORDS.get(type(current), f"a {type(current).__name__}")
    return refusal(
        key, words, given, f"e.g. --config.{key}={flag_value(current)} (the config file's value)"
    )


def _default_fix(cls: type, name: str, key: str, suggest_defaults: bool) -> str:
    """A refusal's fix where none is more specific: the key's default as a flag, if asked for."""
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    if not suggest_defaults or field.default is dataclasses.MISSING:
        return ""
    return f"e.g. --config.{key}={flag_value(field.default)} (the default)"


def check_project_sections(
    config: Mapping[str, Any], sections: Mapping[str, type], *, defaults_module: str
) -> None:
    """An agent project's sections of `config` (e.g. {"agent": TD3Settings, "env": ...})
    checked by `typed_section`, each refused value's line ending with its default as a flag;
    a missing key points at `<defaults_module>.get_<section>_config()`."""
    for section, cls in sections.items():
        typed_section(
            cls,
            config[section],
            f"{section}.",
            suggest_defaults=True,
            start_from=f"{defaults_module}.get_{section}_config()",
        )


def typed_section(
    cls: type,
    values: Mapping[str, Any],
    prefix: str,
    *,
    fixed: Mapping[str, Any] | None = None,
    suggest_defaults: bool = False,
    start_from: str = EXPERIMENT_DEFAULTS,
) -> Any:
    """`cls(**values)`, refusing unknown or missing keys, wrong types and values out of
    range (`check` / `in_range` in `__post_init__`) by their full name, in one line.

    Args:
      cls: a frozen dataclass whose fields are the section's keys (see the module docstring
        for the types); its `__post_init__` checks ranges.
      values: the section (dict or ConfigDict).
      prefix: the section's path with a trailing dot ("agent."), "" at the top level.
      fixed: constructor arguments that are not config keys (e.g. a workdir).
      suggest_defaults: end a refused value's line with the fix, the key's default as a
        flag (`; e.g. --config.agent.batch_size=256 (the default)`).
      start_from: where a complete section comes from, for a missing key.
    """
    import ml_collections

    fixed = dict(fixed or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in fixed}
    names = list(fields)
    unknown = [key for key in values if key not in names]
    if prefix and len(unknown) >= 3 and 2 * len(unknown) >= len(values):
        # Most of the section is not this project's: a config file of another project.
        shown = ", ".join(unknown[:4]) + (", ..." if len(unknown) > 4 else "")
        raise ConfigError(
            fact_refusal(
                f"{prefix.rstrip('.')}: {len(unknown)} of its {len(values)} keys are not this "
                f"project's ({shown})",
                f"its keys are {', '.join(sorted(names))}",
                "is --config another project's config? run it with that project's entry "
                "point, or pick one of this project's from configs/",
            )
        )
    if unknown:
        raise unknown_key(prefix, unknown[0], names)
    kwargs = {}
    for name in names:
        if name not in values:
            raise missing_key(prefix, name, start_from)
        value, annotation = values[name], hints[name]
        if _ALLOWED not in fields[name].metadata:
            _check_declared(cls, name, annotation, f"{prefix}{name}")
        if dataclasses.is_dataclass(annotation):
            if not isinstance(value, Mapping | ml_collections.ConfigDict):
                keys = ", ".join(f.name for f in dataclasses.fields(annotation))
                allowed_words = f"a section with keys {keys}"
                raise ConfigError(refusal(f"{prefix}{name}", allowed_words, value))
            value = typed_section(
                annotation,
                value,
                f"{prefix}{name}.",
                suggest_defaults=suggest_defaults,
                start_from=start_from,
            )
        elif _ALLOWED in fields[name].metadata:
            pass  # its __post_init__ checks the type too, in its declared words
        elif not _type_ok(value, annotation):
            key = f"{prefix}{name}"
            fix = _default_fix(cls, name, key, suggest_defaults)
            raise ConfigError(refusal(key, _describe(annotation), value, fix))
        elif _sequence_item(annotation) is not None:
            value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs, **fixed)
    except OutOfRangeError as error:
        key = f"{prefix}{error.key}"
        field = error.key.split(".", 1)[0]
        fix = error.fix or _default_fix(cls, field, f"{prefix}{field}", suggest_defaults)
        raise ConfigError(refusal(key, error.allowed, error.value, fix)) from None
