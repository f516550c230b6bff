"""The options of a run, defined once: where its record lives, which of the grid's points, on which Ray, with what.

:class:`RunOptions` feeds `ablate run`'s and `ablate slurm`'s argparse (:func:`add_run_options`: each field is one
flag, its type and bound checked by argparse, so a bad value is refused with exit 2 before anything is written or
Ray starts), :func:`ablate.service.execution.runner.run_grid`, :func:`ablate.service.execution.slurm.slurm_job`
and the printed resume command (:func:`resume_words`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ablate.config import ConfigError, quote
from ablate.service.specs.grid import DEFAULT_SCALE, SCALES
from ablate.service.specs.presets import PRESET_FILE_SUFFIXES

__all__ = ["RunOptions", "add_run_options", "build_options", "command_options", "options_from_args", "resume_words"]

Command = Literal["run", "slurm"]


def _meta(flag: str | None = None, *, commands: tuple[str, ...] = ("run", "slurm"), resume: bool = True, **kw) -> dict:
    """A field's CLI: its flag (default ``--<name>``), the commands that take it, whether the resume command
    repeats it, and argparse extras (``metavar``, ``nargs``, ``negate`` for a ``--no-…`` switch)."""
    return {"flag": flag, "commands": commands, "resume": resume, **kw}


class RunOptions(BaseModel):
    """How a grid runs. Every field is one option of `ablate run` (and of `ablate slurm` where it says so)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    scale: Literal[SCALES] = Field(  # type: ignore[valid-type]
        DEFAULT_SCALE, description="the grid's scale", json_schema_extra=_meta(always=True)
    )
    preset: str | None = Field(
        None,
        description="train every trial with a named preset, e.g. fast; the grid's axes and --set win",
        json_schema_extra=_meta(),
    )
    settings: list[str] | None = Field(
        None,
        description="override a setting for every trial",
        json_schema_extra=_meta("--set", nargs="*", metavar="KEY=VALUE"),
    )
    variants: str | None = Field(
        None, description="run only these of the grid's variants", json_schema_extra=_meta(metavar="NAME[,NAME]")
    )
    storage: str = Field(
        "runs",
        description="folder holding runs, local or shared by every node (default: ./runs), or object storage: "
        "s3://bucket/prefix or gs://…",
        json_schema_extra=_meta(),
    )
    name: str | None = Field(
        None,
        min_length=1,
        description="run name, a folder name under --storage (default: <grid>-<scale>, or <grid>-<scale>-<preset>)",
        json_schema_extra=_meta(),
    )
    address: str | None = Field(
        None,
        description="join an existing Ray cluster: its head's address (host:6379, as `ray start --head` prints it), "
        "auto, or ray://host:10001",
        json_schema_extra=_meta(commands=("run",)),
    )
    cpus_per_trial: float = Field(
        1.0, gt=0, allow_inf_nan=False, description="CPUs per trial; fractions share a core", json_schema_extra=_meta()
    )
    gpus_per_trial: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="GPUs per trial; 0 trains on the CPU, fractions share a GPU (ablate slurm: 1 when nodes have GPUs)",
        json_schema_extra=_meta(),
    )
    max_concurrent: int | None = Field(
        None, ge=1, description="trials running at once", json_schema_extra=_meta(commands=("run",))
    )
    keep_checkpoints: int = Field(
        2,
        ge=1,
        description="checkpoints kept per trial; a retry or a resume continues from the newest",
        json_schema_extra=_meta(commands=("run",), resume=False),
    )
    checkpoint_every: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds between a trial's checkpoints, at a report (its last report and a stop always write "
        "one; a kill costs at most this much training, done again to the same numbers); 0 = every report",
        json_schema_extra=_meta(commands=("run",), resume=False),
    )
    results_every: float = Field(
        2.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds between a grid trial's results to Ray: its reports in between travel together, each "
        "still a row of its log (a search's trial sends every report, its scheduler judges each); 0 = every report",
        json_schema_extra=_meta(commands=("run",), resume=False),
    )
    max_failures: int = Field(
        2,
        ge=0,
        description="failures a trial may have, each retried from its checkpoint (a dead process or node, its own "
        "error); 0 retries none",
        json_schema_extra=_meta(commands=("run",), resume=False),
    )
    tensorboard: bool = Field(
        False,
        description="also write TensorBoard event files",
        json_schema_extra=_meta(commands=("run",), resume=False),
    )
    dashboard: bool = Field(
        True,
        description="start Ray without its web dashboard (headless machines, a Ray without the dashboard's packages)",
        json_schema_extra=_meta("--no-dashboard", negate=True),
    )
    pack: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        None,
        description="train up to K grid points that share every shape as one batched model per trial (for GPUs; "
        "auto: as many as fit on the trial's GPU share, none on the CPU); each point keeps its own trial folder",
        json_schema_extra=_meta(metavar="K|auto"),
    )
    resume: bool = Field(
        False,
        description="continue a run that exists (refused when there is none); without it, the same name continues too",
        json_schema_extra=_meta(commands=("run",), resume=False),
    )
    yes: bool = Field(
        False,
        description="start a grid of more trials than ablate runs without asking (see `ablate run --help`)",
        json_schema_extra=_meta(commands=("run",), resume=False),
    )
    verbose: int = Field(
        1,
        ge=0,
        le=3,
        description="Ray Tune's progress output (0-3)",
        json_schema_extra=_meta(commands=("run",), resume=False),
    )


def build_options(options: RunOptions | None = None, **fields: Any) -> RunOptions:
    """``options`` with ``fields`` set over them, checked: a bad value is a one-line :class:`ConfigError` naming its
    flag (``--pack 'many': must be a whole number >= 1 or auto (…)``), as the CLI would refuse it."""
    values = {**(options.model_dump(exclude_unset=True) if options else {}), **fields}
    try:
        return RunOptions(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err.get("loc") else ""
        if name not in RunOptions.model_fields:
            raise ConfigError(f"run options: {err['msg']}") from None
        field = RunOptions.model_fields[name]
        annotation = str(field.annotation)
        kind = float if "float" in annotation else int if "int" in annotation else None
        if name == "pack":
            rule = "must be a whole number >= 1 or auto"
        elif kind is not None and err["type"] in ("greater_than", "greater_than_equal", "less_than_equal"):
            rule = f"must be {_bound(field, kind)}"
        else:
            rule = err["msg"][0].lower() + err["msg"][1:]
        raise ConfigError(f"{_flag(name)} {quote(values.get(name))}: {rule} ({field.description})") from None


def _extra(name: str) -> dict[str, Any]:
    return dict(RunOptions.model_fields[name].json_schema_extra or {})  # type: ignore[arg-type]


def _flag(name: str) -> str:
    return _extra(name).get("flag") or "--" + name.replace("_", "-")


def _checked(name: str, kind: type):
    """An argparse ``type=``: the text as ``kind``, refused (in argparse's words, exit 2) unless this field of
    :class:`RunOptions` takes it: ``argument --cpus-per-trial: must be a number > 0 (CPUs per trial; …), got 0``."""
    field = RunOptions.model_fields[name]

    def convert(text: str):
        if name == "name" and not text:
            raise argparse.ArgumentTypeError(
                "expected a run name (one folder name inside --storage), got '' (leave --name out for the default name)"
            )
        if name == "pack":
            value: Any = "auto" if text == "auto" else _number(text, int, "a whole number >= 1 or auto")
        else:
            value = text if kind is str else _number(text, kind, _bound(field, kind))
        try:
            RunOptions.model_validate({name: value})
        except ValidationError:
            what = "a whole number >= 1 or auto" if name == "pack" else _bound(field, kind)
            raise argparse.ArgumentTypeError(f"must be {what} ({field.description}), got {text}") from None
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its own messages
    return convert


def _number(text: str, kind: type, what: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def _bound(field: Any, kind: type) -> str:
    """``a number > 0``, ``an integer >= 1``: what a numeric field takes."""
    noun = "an integer" if kind is int else "a number"
    for item in field.metadata:
        for key, op in (("gt", ">"), ("ge", ">=")):
            if getattr(item, key, None) is not None:
                return f"{noun} {op} {getattr(item, key)}"
    return noun


def add_run_options(parser: argparse.ArgumentParser, command: Command) -> None:
    """Add every :class:`RunOptions` field that ``command`` takes to ``parser`` (dest = the field's name)."""
    for name, field in RunOptions.model_fields.items():
        extra = _extra(name)
        if command not in extra["commands"]:
            continue
        flag, help_text = _flag(name), field.description
        annotation = str(field.annotation)
        if extra.get("negate"):
            parser.add_argument(flag, dest=name, action="store_false", help=help_text)
        elif field.annotation is bool:
            parser.add_argument(flag, dest=name, action="store_true", help=help_text)
        elif name == "scale":
            parser.add_argument(flag, dest=name, default=DEFAULT_SCALE, choices=SCALES, help=help_text)
        elif "list" in annotation:
            parser.add_argument(flag, dest=name, nargs=extra.get("nargs"), metavar=extra.get("metavar"), help=help_text)
        else:
            kind = float if "float" in annotation else int if "int" in annotation else str
            parser.add_argument(
                flag,
                dest=name,
                type=_checked(name, kind),
                default=field.default,
                metavar=extra.get("metavar"),
                help=help_text,
            )


def command_options(options: RunOptions, command: Command) -> RunOptions:
    """The options that ``command`` takes, as ``options`` holds them; every other field at its default."""
    taken = {name for name in RunOptions.model_fields if command in _extra(name)["commands"]}
    return RunOptions(**options.model_dump(include=taken & options.model_fields_set))


def options_from_args(args: argparse.Namespace, **changes: Any) -> RunOptions:
    """The :class:`RunOptions` that parsed ``args`` hold (fields a command does not take keep their defaults)."""
    values = {name: getattr(args, name) for name in RunOptions.model_fields if hasattr(args, name)}
    return RunOptions(**{**values, **changes})


def resume_words(options: RunOptions, command: Command = "run") -> list[str]:
    """The flags that repeat ``options`` in a command line (the resume command; `ablate slurm`'s run): each field
    that the command takes and the resume command repeats, where it differs from its default. A preset file is
    named by its absolute path, so the command works from any folder (a job starts in another)."""
    words: list[str] = []
    for name, field in RunOptions.model_fields.items():
        extra = _extra(name)
        value = getattr(options, name)
        if command not in extra["commands"] or not extra["resume"]:
            continue
        if value == field.default and not extra.get("always"):
            continue
        if name == "preset" and Path(value).suffix in PRESET_FILE_SUFFIXES:  # a preset file, named from anywhere
            value = str(Path(value).expanduser().resolve())
        if isinstance(value, bool):
            words.append(_flag(name))
        elif isinstance(value, list):
            words += [_flag(name), *value] if value else []
        else:
            words += [_flag(name), f"{value:g}" if isinstance(value, float) else str(value)]
    return words
