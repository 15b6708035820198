"""The entry points' flags and their parsing: one clear line for every bad flag, override or
config file, instead of a traceback (`parse_flags`)."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import math
import re
import sys
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import ml_collections
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from magi_lp import console, engines
from magi_lp.config_schema import did_you_mean, fact_refusal, override_refusal
from magi_lp.errors import ConfigError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (ml_collections).", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run folder: logs, checkpoints, node outputs. Reuse it to resume a run."
)
_DRY_RUN = flags.DEFINE_bool(
    "dry_run", False, "Print the placement plan (node, devices, memory, env) and exit."
)
_LAUNCHER = flags.DEFINE_enum(
    "launcher",
    None,
    engines.launchers(),
    "The engine that runs the nodes (lp_main only; default: local where Launchpad is "
    "installed, else ray): "
    + "; ".join(f"{name}: {engines.engine(name).summary}" for name in engines.launchers())
    + " (docs/cluster.md).",
)
_RENDER = flags.DEFINE_string(
    "render", None, "With --launcher hosts|slurm|kubernetes: write the generated files here."
)

_STATUS_EVERY = flags.DEFINE_float(
    "status_every",
    30.0,
    "Seconds between status lines when the output is not a terminal (lp_main only); on a "
    "terminal the status table refreshes every few seconds.",
)

flags.register_validator(
    "status_every",
    lambda seconds: math.isfinite(seconds) and seconds > 0,
    message="must be a number of seconds > 0; e.g. --status_every=30 (the default)",
)

MakeExperiment = Callable[..., Any]
ValidateConfig = Callable[[Any], None]


def _fail(message: str) -> NoReturn:
    console.error(message)
    sys.exit(2)


def _require_a_config(spec: str, config: Any) -> None:
    """Refuses what a config file's get_config() returned unless it is a ConfigDict (None:
    a forgotten return)."""
    if not isinstance(config, ml_collections.ConfigDict):
        # ml_collections hands a file that failed with an OSError over as a placeholder that
        # raises it when touched: let it, so that it is said as the OSError it is.
        hasattr(config, "keys")
        raise ConfigError(
            fact_refusal(
                f"--config {spec}: get_config() returned {type(config).__name__}",
                "",
                "return an ml_collections.ConfigDict, as the files in configs/ do",
            )
        )


def _config_path() -> str | None:
    flag = flags.FLAGS["config"]
    return flag.config_filename if flag.present else None


def _example_config() -> str:
    """The config file the entry script's docstring runs it with (each project's own, e.g.
    TD3's configs/td3_cartpole.py), else DrQ-v2's configs/reacher_hard.py."""
    main = sys.modules.get("__main__")
    doc = getattr(main, "__doc__", None)
    script = getattr(main, "__file__", None)
    if doc is None and script:  # python -OO drops docstrings: read it from the script
        try:
            doc = ast.get_docstring(ast.parse(Path(script).read_text()))
        except (OSError, SyntaxError, ValueError):
            doc = None
    match = re.search(r"--config[ =](\S+\.py)", doc or "")
    return match.group(1) if match else "configs/reacher_hard.py"


def _config_name() -> str:
    path = _config_path()
    return Path(path.split(":", 1)[0]).stem if path else "run"


def _load_config_file(spec: str) -> Any:
    """Runs a config file's `get_config` (`path[:argument]`), as ml_collections does."""
    path, _, argument = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("_magi_lp_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(argument) if argument else module.get_config()


def _missing_key(config: Any, dotted: str) -> str | None:
    """Why `dotted` is no key of `config`, with the closest valid names; None if it is one."""
    node, walked = config, []
    for part in dotted.split("."):
        keys = list(node.keys()) if hasattr(node, "keys") else []
        if part not in keys:
            prefix = "".join(f"{name}." for name in walked)
            close = did_you_mean(part, keys, prefix=prefix, otherwise="")
            if close:
                return fact_refusal(f"no config key {dotted}", "", close)
            return fact_refusal(
                f"{'.'.join(walked) or 'the config'} has no key {part!r}",
                "command-line overrides can only change keys the config file sets",
                "add it to the config file",
            )
        node, walked = node[part], [*walked, part]
    return None


def _override_error(argv: list[str], error: BaseException) -> str:
    """One line for an override ml_collections refused: the missing key, else its reason."""
    overrides = [arg for arg in argv if arg.startswith("--config.")]
    config_arg = _config_arg(argv)
    if config_arg is not None:
        try:
            config = _load_config_file(config_arg)
        except Exception:  # the file's own problems are reported elsewhere
            config = None
        else:
            try:
                _require_a_config(config_arg, config)
            except ConfigError as error:
                return str(error)
        if config is not None:
            for override in overrides:
                why = _missing_key(config, override[len("--config.") :].split("=", 1)[0])
                if why:
                    return f"{override}: {why}"
    text = str(error.args[0]) if error.args else str(error)
    return f"bad config override ({' '.join(overrides)}): {' '.join(text.split())}"


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing, with one clear line instead of a traceback for bad input."""
    absl_logger = absl_logging.get_absl_logger()
    # ml_collections warns when get_config() returns None; _checked_inputs refuses it in one line.
    absl_logger.addFilter(_not_a_config_warning)
    try:
        rest = flags.FLAGS(argv)
    except Exception as error:  # each kind gets its own line (_flag_error)
        _fail(_flag_error(argv, error))
    finally:
        absl_logger.removeFilter(_not_a_config_warning)
    _refuse_a_repeated_sequence(argv)
    return rest


def _overrides(argv: list[str]) -> list[tuple[str, str]]:
    """(key, value) of each `--config.<key>=<value>` / `--config.<key> <value>`, in order."""
    found = []
    for index, arg in enumerate(argv):
        if not arg.startswith(("--config.", "-config.")):
            continue
        key, equals, value = arg.lstrip("-")[len("config.") :].partition("=")
        if not equals and index + 1 < len(argv):
            value = argv[index + 1]
        found.append((key, value))
    return found


def _refuse_a_repeated_sequence(argv: list[str]) -> None:
    """ml_collections joins a tuple key's repeated overrides ((32,32) then (16,16) gives
    (32,32,16,16)) where a scalar's last one wins: a key given twice whose value is a
    sequence is refused."""
    given: dict[str, list[str]] = {}
    with contextlib.suppress(flags.Error):  # as absl read them: --flagfile's lines in place
        argv = flags.FLAGS.read_flags_from_files(argv, force_gnu=False)
    for key, value in _overrides(argv):
        given.setdefault(key, []).append(value)
    config = _CONFIG.value
    for key, values in given.items():
        if len(values) < 2 or config is None or _missing_key(config, key) is not None:
            continue
        node = config
        for part in key.split("."):
            node = node[part]
        if isinstance(node, (tuple, list)):
            _fail(
                fact_refusal(
                    f"--config.{key} is given {len(values)} times ({', then '.join(values)})",
                    f"the values of a sequence are joined, not replaced (it would be {node})",
                    "give it once",
                )
            )


def _not_a_config_warning(record: Any) -> bool:
    return "get_config() returned None" not in record.getMessage()


def _flag_error(argv: list[str], error: Exception) -> str:
    """The one line for an exception absl's flag parsing raised."""
    if _raised_in_code_of_this_checkout(argv, error):
        raise error  # a bug, met while the file ran: it keeps its traceback
    where = _line_in_config_file(argv, error)
    if where is not None and not isinstance(error, (flags.Error, SyntaxError)):
        # The file itself failed while it loaded (an import, a name, a lookup at module
        # level): not an override's fault, whatever the exception's kind.
        return (
            f"{_config_flag(argv)}: the file raised {type(error).__name__} at "
            f"{where}: {_one_line(error)}; fix the file, or pick one from configs/"
        )
    if isinstance(error, flags.Error):
        cause = _config_error_in(error)
        if cause is not None:  # raised while the config file ran (a refusal, a checked value)
            # ml_collections re-raises it with the traceback as text; keep the last line.
            # (Its last line: "magi_lp.errors.ConfigError: ...", or a subclass's name.)
            refusal = re.sub(r"^[\w.]*Error: ", "", str(cause).strip().splitlines()[-1])
            line = _config_file_line_in_chain(argv, error)
            # The file's line that made the refused call: a refusal of a toolkit class or
            # helper (ResourceSpec.cpu_threads, resource_spec()) names no config key.
            return f"{_config_flag(argv)} (line {line}): {refusal}" if line else refusal
        if "Error whilst parsing config file" in str(error):
            return _get_config_error(str(error))
        switch = re.match(
            r"flag --(\w+)=(.*): \('Non-boolean argument to boolean flag'", str(error)
        )
        if switch:
            name, value = switch.groups()
            return fact_refusal(
                f"--{name}={value}", "it is a switch", f"give --{name} alone (or --no{name})"
            )
        if (
            isinstance(error, flags.UnrecognizedFlagError)
            and error.flagname.startswith("config.")
            and _config_arg(argv) is None
        ):
            return fact_refusal(
                f"--{error.flagname}",
                "it overrides a key of the config file, and no --config was given",
                f"give the file too, e.g. --config {_example_config()} --{error.flagname}=...",
            )
        return _unreadable_override(argv, str(error)) or f"{error}. See --helpfull."
    if isinstance(error, OSError):
        reason = error.__cause__ or str(error).splitlines()[-1].strip()
        return f"{_config_flag(argv)}: cannot load the config file: {reason}"
    if isinstance(error, SyntaxError):
        path = _config_arg(argv)
        line = f" at line {error.lineno}" if error.lineno else ""
        name = error.filename or ""
        flag = _config_flag(argv)
        if name.startswith("<") or not path:  # text the file compiles or evals
            return f"{flag}: reading the config raised SyntaxError: {error.msg}; fix the file"
        if name and not _is_config_file(name, path):  # a module the file imports
            return (
                f"--config {path}: {error.filename}, which it imports, has a syntax "
                f"error{line}: {error.msg}; fix that file"
            )
        return (
            f"--config {path}: the config file has a syntax error{line}: {error.msg}; fix the file"
        )
    if isinstance(error, AttributeError) and "get_config" in str(error):
        return (
            f"{_config_flag(argv)}: the file defines no get_config(); a config "
            "file defines get_config() returning an ml_collections.ConfigDict (see configs/)"
        )
    if isinstance(error, (AttributeError, KeyError, TypeError, ValueError)):
        return _override_error(argv, error)
    return (
        f"{_config_flag(argv)}: reading the config raised {type(error).__name__}: "
        f"{_one_line(error)}; fix the file, or pick one from configs/"
    )


def _raised_in_code_of_this_checkout(argv: list[str], error: BaseException) -> bool:
    """Whether `error` (no ConfigError) was raised in code neither the config file's nor a
    library's: the toolkit's, a project's (which config files call), or the user's own
    modules. Taken from its traceback, or from the traceback text ml_collections puts in
    the TypeError or ValueError it re-raises. The file's own mistakes (a name, a lookup, an
    import, a library refusing an argument) are one line; a bug there keeps its traceback."""
    if _config_error_in(error) is not None:
        return False
    files = [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
    if "Error whilst parsing config file" in str(error):
        files = [name for name, _, _ in _frames_in_text(str(error))]
    spec = _config_arg(argv)
    if not files or not spec or not any(_is_config_file(name, spec) for name in files):
        return False  # the file never ran into it: absl's or an override's error
    innermost = files[-1]
    return not (
        _is_config_file(innermost, spec)
        or innermost.startswith("<")  # importlib's frozen frames, generated code
        or _in_a_library(innermost)
    )


def _config_error_in(error: BaseException) -> ConfigError | None:
    """The ConfigError `error` is, or was raised from (ml_collections re-raises a config
    file's ValueError as a new one of its type, and absl wraps that in a flags.Error)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ConfigError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _in_a_library(filename: str) -> bool:
    """Whether `filename` is the standard library's or an installed package's."""
    path = Path(filename).resolve()
    roots = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(path.is_relative_to(Path(root).resolve()) for root in roots if root)


def _unreadable_override(argv: list[str], message: str) -> str | None:
    """One refusal for `--config.<key>=<value>` the flag parser could not read as the key's
    kind of value ("flag --config.num_actors=True: invalid literal for int()..."), saying
    what the key takes and its value in the config; None where that cannot be told."""
    match = re.match(r"flag --config\.([\w.]+)=(.*?): ", message)
    spec = _config_arg(argv)
    if not match or not spec:
        return None
    key, given = match.groups()
    try:
        node = _load_config_file(spec)
        for part in key.split("."):
            node = node[part]
    except Exception:  # the file's or the key's own problem is said elsewhere
        return None
    return override_refusal(key, given, node)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or "(no message)"


def _line_in_config_file(argv: list[str], error: BaseException) -> str | None:
    """`line <n>` of the innermost frame of `error`'s traceback that runs the config file
    itself, or None when the file never ran into it (an override's or absl's error)."""
    spec = _config_arg(argv)
    if not spec:
        return None
    lines = [
        frame.lineno
        for frame in traceback.extract_tb(error.__traceback__)
        if _is_config_file(frame.filename, spec)
    ]
    return f"line {lines[-1]}" if lines else None


def _is_config_file(filename: str | None, spec: str) -> bool:
    """Whether `filename` (a traceback frame's) is the config file of `--config spec`."""
    config_file = Path(spec.split(":", 1)[0]).resolve()
    return bool(filename) and Path(filename).resolve() == config_file


def _config_flag(argv: list[str]) -> str:
    """`--config <value>` as the command line gave it, or `--config` alone where it did not
    (a --flagfile's)."""
    value = _config_arg(argv)
    return "--config" if value is None else f"--config {value}"


def _config_arg(argv: list[str]) -> str | None:
    """The value given to --config on the command line."""
    return next(
        (argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--config"),
        next((arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")), None),
    )


def _get_config_error(message: str) -> str:
    """One line for an exception a config file's get_config() raised (ml_collections hands
    it over as the text of its traceback)."""
    head = message.split(": Error whilst parsing", 1)[0].replace("flag --config=", "--config ")
    last = next((line.strip() for line in reversed(message.splitlines()) if line.strip()), "")
    if "get_config() takes 0 positional arguments" in last:
        spec = head.removeprefix("--config ")
        return (
            f"{head}: this config file's get_config() takes no argument, so "
            f"':{spec.partition(':')[2]}' cannot select anything; use --config "
            f"{spec.partition(':')[0]}"
        )
    spec = head.removeprefix("--config ")
    if "get_config() missing 1 required positional argument" in last:
        return (
            f"{head}: this config file's get_config() takes an argument ({last.rsplit(': ', 1)[-1]}"
            f"); give it after a colon: --config {spec.partition(':')[0]}:<argument>"
        )
    frames = _frames_in_text(message)
    inside = [(line, scope) for name, line, scope in frames if _is_config_file(name, spec)]
    if inside:
        line, scope = inside[-1]
        at = "get_config()" if scope == "get_config" else "the file"
        return f"{head}: {at} raised {last} at line {line}; fix the file, or pick one from configs/"
    return f"{head}: its get_config() raised {last}"


def _config_file_line_in_chain(argv: list[str], error: BaseException) -> str | None:
    """The line of the config file in the innermost frame that runs it, over `error`'s chain
    of causes: from their tracebacks, or from the traceback text ml_collections puts in the
    message of an exception it re-raises. None when the file never ran into it."""
    spec = _config_arg(argv)
    if not spec:
        return None
    lines: list[str] = []
    seen: BaseException | None = error
    while seen is not None:
        frames = [(f.filename, str(f.lineno)) for f in traceback.extract_tb(seen.__traceback__)]
        frames += [(name, line) for name, line, _ in _frames_in_text(str(seen))]
        lines = [line for name, line in frames if _is_config_file(name, spec)] or lines
        if isinstance(seen, ConfigError):
            break  # what it was raised while handling is another matter (a file's except:)
        seen = seen.__cause__ or seen.__context__
    return lines[-1] if lines else None


def _frames_in_text(message: str) -> list[tuple[str, str, str]]:
    """(file, line, scope) of each frame of a traceback given as text (ml_collections puts a
    config file's traceback in the message of the exception it re-raises), outermost first."""
    return re.findall(r'File "([^"]+)", line (\d+), in (\S+)', message)
