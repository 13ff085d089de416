"""Parse `--job.config_file X.toml --section.key value ...` into a JobConfig, errors as one line.

TorchTitan's ConfigManager reports user mistakes as tracebacks (TOML) or multi-line tyro
boxes (command line). `parse_job_config` checks the TOML itself and condenses tyro's
message, raising `ConfigError` with a one-line message.

Importable without torch or torchtitan (`check --help` starts fast): torchtitan is only
imported inside functions here.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import difflib
import importlib
import io
import logging
import os
import re
import sys
import time
import types
import typing
from pathlib import Path
from typing import Any, Literal, NoReturn, Union

from boost_titan.config.errors import ConfigError
from boost_titan.config.files import TOML_MAX_BYTES, read_capped

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

BOOST_CONFIG_MODULE = "boost_titan.config"
_CUSTOM_CONFIG_FLAGS = ("--job.custom_config_module", "--job.custom-config-module")
_CONFIG_FILE_FLAGS = ("--job.config_file", "--job.config-file")


def with_boost_section(args: list[str]) -> list[str]:
    """`args` plus `--job.custom_config_module=boost_titan.config` unless a module is named
    (`parse_job_config` adds it; nothing of ours lets TorchTitan parse `sys.argv` itself)."""
    if any(a.split("=", 1)[0] in _CUSTOM_CONFIG_FLAGS for a in args):
        return list(args)
    return [*args, f"{_CUSTOM_CONFIG_FLAGS[0]}={BOOST_CONFIG_MODULE}"]


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one `error:` line (exit 2), as every command's."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message}; run with --help for the options")


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `error: <message>` as one line on stderr and exit with `code`."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def require_package(package: str, install: str) -> None:
    """End a command that needs `package` with one `error:` line naming `install` (exit 2)
    when it is not installed. In a torchrun job only rank 0 prints it; the other ranks wait
    (up to 10 s) for torchrun to end them once rank 0 has failed, so that their earlier exit
    does not get rank 0 killed before it prints."""
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as e:
        if e.name != package:  # the package is there; something it imports is not
            raise
        if os.environ.get("RANK", "0") != "0":
            time.sleep(10)
            raise SystemExit(2) from None
        fail(f"this command needs the {package} package, which is not installed: {install}")


def reader_gone() -> NoReturn:
    """End quietly once the reader of stdout has gone (`... | head` got what it wanted):
    stdout now points at /dev/null, so the interpreter's last flush cannot fail too."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(0)


def config_file(args: list[str]) -> str | None:
    """The value of `--job.config_file` in `args`, if given."""
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key in _CONFIG_FILE_FLAGS:
            if eq:
                return value
            return args[i + 1] if i + 1 < len(args) else None
    return None


def job_source(args: list[str]) -> str:
    """What set a job's values, for messages: its TOML, the command line, or both."""
    path = config_file(args)
    overrides = [
        a
        for a in args
        if a.startswith("--")
        and a.split("=", 1)[0] not in (*_CONFIG_FILE_FLAGS, *_CUSTOM_CONFIG_FLAGS)
    ]
    if path is None:
        return "the command line"
    return f"{path} and the command line" if overrides else path


def load_toml(path: str) -> dict[str, Any]:
    """Read a TOML file (a regular file within TOML_MAX_BYTES); a missing file, bad syntax
    or nesting too deep to parse becomes a ConfigError."""
    if not os.path.lexists(path):
        raise ConfigError(f"config file {path} not found; pass an existing --job.config_file")
    if os.path.isdir(path):
        raise ConfigError(f"config file {path} is a directory; pass a .toml file")
    data = read_capped(Path(path), "config file", TOML_MAX_BYTES)
    try:
        return _parse_toml(data)
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text ({e.reason}); fix it") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"malformed TOML in {path}: {e}; fix the syntax") from None


def _parse_toml(data: bytes) -> dict[str, Any]:
    """`data` parsed as TOML; nesting too deep for the parser is a TOMLDecodeError."""
    try:
        return tomllib.loads(data.decode())
    except RecursionError:
        raise tomllib.TOMLDecodeError("nested too deep to parse") from None


def parse_job_config(args: list[str], titan_warnings: bool = False):
    """Parse `args` (TOML + overrides, with the `[boost]` section) like TorchTitan does.

    Returns TorchTitan's merged JobConfig. `--help` prints the option list and exits 0.
    TorchTitan's warnings while parsing (a deprecated option) reach its log with
    `titan_warnings` (the training worker's one parse), else they are dropped.
    """
    args = with_boost_section(args)
    path = config_file(args)
    toml = load_toml(path) if path is not None else {}
    if path is not None:
        check_toml(toml, path)
    check_flag_values(args)
    check_module_imports(args, toml)

    from torchtitan.config import ConfigManager

    out, err = io.StringIO(), io.StringIO()
    titan_log = logging.getLogger()
    level = titan_log.level
    if not titan_warnings:
        titan_log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return ConfigManager().parse_args(args)
    except SystemExit as e:
        if e.code in (0, None):
            sys.stdout.write(out.getvalue())
            raise
        raise ConfigError(condense_tyro_message(err.getvalue() + out.getvalue())) from None
    except (ValueError, ImportError) as e:
        raise ConfigError(f"{e}".splitlines()[0]) from None
    except Exception as e:
        if "old tokenizer.model" not in str(e):
            raise
        raise ConfigError(  # TorchTitan refuses any hf_assets_path ending in tokenizer.model
            "model.hf_assets_path may not end in tokenizer.model (TorchTitan refuses it); "
            "pass the folder that holds the tokenizer.model"
        ) from None
    finally:
        titan_log.setLevel(level)


def condense_tyro_message(text: str) -> str:
    """One line out of tyro's (boxed or plain) error: its first paragraph and first suggestion."""
    paragraphs: list[list[str]] = [[]]
    for line in text.splitlines():
        body = line.strip(" │╭╮╰╯\t")
        if not body:
            continue
        if set(body) <= set("─-"):  # a rule between paragraphs
            paragraphs.append([])
        elif "╭" in line:  # a box top carrying the title
            paragraphs += [[body.strip("─ ")], []]
        else:
            paragraphs[-1].append(body)
    paragraphs = [p for p in paragraphs if p]
    if not paragraphs:
        return "invalid command line; run with --help for the valid options"
    # paragraphs[0] is the title ("Value error"); the next one says what is wrong.
    message = " ".join(paragraphs[1] if len(paragraphs) > 1 else paragraphs[0])
    suggestions = [
        row.split()[0]
        for p in paragraphs
        if p[0].lower().startswith("perhaps you meant")
        for row in p[1:]
        if row.startswith("--")
    ]
    if suggestions:
        message += f"; did you mean {suggestions[0]}?"
    if choice := _INVALID_CHOICE.search(message):
        return _unknown_choice(**choice.groupdict())
    return f"{message} (run with --help for the valid options)"


_INVALID_CHOICE = re.compile(
    r"invalid choice (?P<value>'.*') for argument '--(?P<name>[\w.-]+)'\. "
    r"Expected one of (?P<choices>\(.*\))"
)
"""tyro's message for a value outside a `Literal` type's choices."""


def _unknown_choice(value: str, name: str, choices: str | tuple, path: str = "") -> str:
    """A `Literal` option's wrong value (`repr`) as every choice says it: `unknown [boost]
    arch 'x'; choose one of fullrank, svd, cola, lax` (`section.key` outside `[boost]`;
    `choices` a tuple or tyro's text of one; `path`: the TOML that holds it)."""
    section, _, key = name.replace("-", "_").partition(".")
    label = f"[boost] {key}" if section == "boost" else f"{section}.{key}"
    values = ast.literal_eval(choices) if isinstance(choices, str) else choices
    where = f" in {path}" if path else ""
    return f"unknown {label} {value}{where}; choose one of {', '.join(map(str, values))}"


# ---- boolean flags given a value ------------------------------------------------------
_BOOL_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})


def _sections() -> dict[str, Any]:
    """Section name -> type of TorchTitan's JobConfig merged with our sections."""
    from torchtitan.config import JobConfig

    from boost_titan.config import JobConfig as BoostSections

    return {**_field_types(JobConfig), **_field_types(BoostSections)}


def _negated(name: str) -> str:
    """`section.no_key`: tyro's flag that turns `section.key` off."""
    section, _, key = name.rpartition(".")
    return f"{section}.no_{key}" if section else f"no_{key}"


def bool_flags() -> dict[str, str]:
    """`--section.key` and `--section.no_key` of every boolean option -> `section.key`."""
    flags: dict[str, str] = {}

    def visit(fields: dict[str, Any], prefix: str) -> None:
        for key, kind in fields.items():
            if dataclasses.is_dataclass(kind):
                visit(_field_types(kind), f"{prefix}{key}.")
            elif kind is bool:
                name = f"{prefix}{key}"
                flags[f"--{name}"] = flags[f"--{_negated(name)}"] = name

    visit(_sections(), "")
    return flags


def check_flag_values(args: list[str]) -> None:
    """A boolean option is a flag: `--boost.lowrank_ac true` (or `=true`) is a ConfigError
    that says how to turn it on and off (tyro's own message is "Unrecognized options: true")."""
    flags = bool_flags()
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        name = flags.get("--" + key[2:].replace("-", "_")) if key.startswith("--") else None
        following = value if eq else (args[i + 1] if i + 1 < len(args) else "")
        if name is not None and (eq or following.lower() in _BOOL_WORDS):
            raise ConfigError(
                f"{key} is a flag and takes no value ({following!r} given); write --{name} to "
                f"turn it on, --{_negated(name)} to turn it off"
            )


# ---- options that import a module by name --------------------------------------------
IMPORTING_OPTIONS = (
    "experimental.custom_import",
    "job.custom_config_module",
    "experimental.custom_args_module",
)
"""Options whose value TorchTitan imports as a Python module: custom_import in every worker
(`torchtitan.train`; `check` too, to find a TrainSpec it registers), custom_config_module
while parsing (in `check` too), custom_args_module its deprecated name."""
ALLOW_IMPORT = "boost.allow_custom_import"


def _spellings(name: str, prefix: str = "") -> set[str]:
    """`--section.<prefix>key` as tyro accepts it (underscores or dashes in the key)."""
    section, key = name.split(".")
    return {f"--{section}.{prefix}{key}", f"--{section}.{prefix}{key}".replace("_", "-")}


def _toml_value(toml: dict[str, Any], name: str) -> Any:
    section, key = name.split(".")
    table = toml.get(section)
    return table.get(key) if isinstance(table, dict) else None


def flag_on_command_line(args: list[str], name: str) -> bool:
    """Whether the last `--section.key` / `--section.no_key` of a boolean option in `args`
    turns it on."""
    value = False
    on, off = _spellings(name), _spellings(name, "no_")
    for arg in args:
        flag = arg.partition("=")[0]
        value = True if flag in on else False if flag in off else value
    return value


def named_values(args: list[str], toml: dict[str, Any], name: str) -> list[str]:
    """Every value a text option (`section.key`) is given: in the TOML and on the command
    line (`--section.key value` or `--section.key=value`)."""
    values = [_toml_value(toml, name)]
    flags = _spellings(name)
    for i, arg in enumerate(args):
        flag, eq, given = arg.partition("=")
        if flag in flags:
            values.append(given if eq else (args[i + 1] if i + 1 < len(args) else None))
    return [v for v in values if isinstance(v, str) and v]


def check_module_imports(args: list[str], toml: dict[str, Any]) -> None:
    """ConfigError naming the module an option of IMPORTING_OPTIONS would import (code from
    outside the product, run by `check` or every worker), unless `--boost.allow_custom_import`
    is on the command line (a TOML cannot allow its own imports)."""
    if flag_on_command_line(args, ALLOW_IMPORT):
        return
    for name in IMPORTING_OPTIONS:
        for module in named_values(args, toml, name):
            if module != BOOST_CONFIG_MODULE:
                raise ConfigError(
                    f"{name} = {module!r} makes the job import the Python module {module} "
                    f"(code from outside boost-titan, run by every worker); add --{ALLOW_IMPORT} "
                    "if you trust it, or drop the option"
                )


# ---- TOML check against the (merged) JobConfig dataclasses ----------------------------
def check_toml(data: dict[str, Any], path: str) -> None:
    """Raise ConfigError for a text with a NUL character (no path or name holds one), an
    unknown section/key or a value of the wrong type."""
    _refuse_nul(data, path, "")
    _check_fields(data, _sections(), path, prefix="")


def _refuse_nul(value: Any, path: str, name: str) -> None:
    if isinstance(value, str) and "\0" in value:
        raise ConfigError(f"{name or 'a key'} in {path} holds a NUL character; remove it")
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_nul(key, path, name)
            _refuse_nul(item, path, f"{name}.{key}" if name else key)
    elif isinstance(value, list):
        for item in value:
            _refuse_nul(item, path, name)


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _check_fields(data: dict[str, Any], fields: dict[str, Any], path: str, prefix: str) -> None:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"did you mean {prefix}{close[0]}?" if close else "remove it"
            what = f"key {name}" if prefix else f"section [{name}]"
            raise ConfigError(f"unknown {what} in {path}; {hint}")
        expected = fields[key]
        if dataclasses.is_dataclass(expected):
            if not isinstance(value, dict):
                raise ConfigError(f"{name} in {path} must be a [{name}] table, not a value")
            _check_fields(value, _field_types(expected), path, prefix=f"{name}.")
        elif typing.get_origin(expected) is Literal and value not in typing.get_args(expected):
            raise ConfigError(_unknown_choice(repr(value), name, typing.get_args(expected), path))
        elif not _matches(value, expected):
            raise ConfigError(
                f"{name} = {value!r} in {path} has the wrong type; expected {_describe(expected)}"
            )


def _matches(value: Any, expected: Any) -> bool:
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is Any:
        return True
    if origin is Literal:
        return value in args
    if origin in (Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_matches(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if expected is type(None):
        return value is None
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(expected, type):
        return isinstance(value, expected)
    return True


def _describe(expected: Any) -> str:
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if args:
        return str(expected).replace("typing.", "")
    return getattr(expected, "__name__", str(expected))
