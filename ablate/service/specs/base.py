"""What every spec model shares (grids, presets, dashboards): safe YAML reading, the base model, and one error
line per file that names the file, each bad key's path and what is allowed.

Spec models are plain pydantic models with YAML's own types (``strict``: no ``"3"`` for 3, no ``true`` for 1)
and no unknown keys. :func:`parse_spec` validates a mapping; :func:`spec_error` turns pydantic's errors into
``<file>: <key path>: <what is wrong>; ...``, listing the allowed keys or values (and the closest one) and the
field's description. It finds them by walking the model along each error's location, so a validator only says
what is wrong with its value; one that addresses a sub-key starts its message with ``.key:`` or ``[i]:``.
"""

from __future__ import annotations

import os
import re
import types
import typing
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, create_model
from pydantic.fields import FieldInfo

from ablate.config import QUOTE_LIMIT, RunConfig, did_you_mean, quote, unknown_setting
from ablate.files import read_file_text
from ablate.safe_yaml import YamlRefused, yaml_loader, yaml_refusal

__all__ = ["SettingName", "Settings", "Spec", "parse_spec", "partial", "read_yaml", "spec_error"]

_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "string": "a string",
    "bool": "true/false",
    "list": "a list",
    "tuple": "a list",
    "dict": "a mapping",
    "model": "a mapping",
}
_SKIP = ("function-", "model-", "[key]")
_CUSTOM = ("distribution",)  # custom error types whose message says what is allowed
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
_MAX_PROBLEMS = 10  # problems one error line names; it counts the others


class Spec(BaseModel):
    """Base of every spec model: YAML's own types, and unknown keys are errors (listing the allowed ones)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _setting_name(key: str) -> str:
    if key not in RunConfig.model_fields:
        raise ValueError(unknown_setting(key))
    return key


#: The name of a RunConfig field (a misspelt one names the closest and lists them all).
SettingName = Annotated[str, AfterValidator(_setting_name)]
#: RunConfig settings by name; their values are checked by RunConfig when the trials are built.
Settings = dict[SettingName, Any]


def read_yaml(source: str | os.PathLike, error: type[Exception], *, text: str | None = None) -> dict[str, Any]:
    """Safe-load a YAML mapping from the file ``source`` (or from ``text``, named ``source`` in errors).

    Malformed YAML raises ``error`` naming the file, line and column; a top level that is not a mapping too, and
    YAML whose aliases would expand it past :data:`ablate.safe_yaml.ALIAS_LIMIT` (an alias bomb: nine levels of nine
    aliases are a few hundred bytes of text and billions of values), that holds an alias inside the value it
    names, or that nests deeper than :data:`ablate.safe_yaml.DEPTH_LIMIT`: one line each, before anything is built.
    """
    import yaml

    if text is None:
        text = read_file_text(source, error)
    try:
        data = yaml.load(text, Loader=yaml_loader())  # noqa: S506 (a SafeLoader subclass)
    except yaml.reader.ReaderError as exc:  # a control character: not a text file
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise error(f"{source}: not a YAML text file (character #x{char:04x} at position {exc.position})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise error(f"{source}: malformed YAML at {where}: {getattr(exc, 'problem', exc)}") from None
    except (YamlRefused, RecursionError) as exc:
        raise error(f"{source}: refused: {yaml_refusal(exc)}") from None
    if not isinstance(data, dict):
        raise error(f"{source}: the top level must be a mapping of keys")
    return data


def parse_spec(
    model: type[BaseModel],
    data: dict[str, Any],
    source: str | os.PathLike,
    error: type[Exception],
    context: dict[str, Any] | None = None,
    strict: bool | None = None,
):
    """Validate ``data`` with ``model`` (``context`` reaches its validators; ``strict=False`` accepts what pydantic
    can convert, as ``--set`` values); any problem raises ``error`` naming ``source`` and the key."""
    try:
        return model.model_validate(data, context=context, strict=strict)
    except ValidationError as exc:
        raise spec_error(exc, source, error, model) from None


def partial(model: type[Spec]) -> type[Spec]:
    """``model`` with every field optional (default None) and no model validators: what a grid's top level or
    one of its scales may give of it before they merge into the whole, each value checked where it is written."""
    fields = {}
    for name, f in model.model_fields.items():
        kind = Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation
        fields[name] = (
            kind | None,
            Field(default=None, description=f.description, json_schema_extra=f.json_schema_extra),
        )
    return create_model(f"Partial{model.__name__}", __base__=Spec, __doc__=model.__doc__, **fields)


# ------------------------------------------------------------------------------------------ errors
class _Place:
    """Where an error's location leads in a model: its text, the model and field it ends in, the union tag."""

    def __init__(self) -> None:
        self.text = ""
        self.model: type[BaseModel] | None = None  # the model the last key was looked up in
        self.field: FieldInfo | None = None  # the last field passed
        self.tag: str | None = None  # the tag of the last tagged-union member passed (e.g. a panel's kind)
        self.tag_model: type[BaseModel] | None = None


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """A type without Annotated and None: the bare type and the Annotated metadata."""
    meta: list[Any] = []
    while True:
        if get_origin(tp) is Annotated:
            tp, *more = get_args(tp)
            meta += more
        elif get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp):
            rest = [a for a in get_args(tp) if a is not type(None)]
            tp = rest[0] if len(rest) == 1 else Union[tuple(rest)]  # noqa: UP007 - built at run time
        else:
            return tp, meta


def _member_tag(member: Any, discriminator: Any) -> str | None:
    bare, meta = _unwrap(member)
    tag = next((m.tag for m in meta if isinstance(m, Tag)), None)
    if tag is None and isinstance(discriminator, str) and isinstance(bare, type) and issubclass(bare, BaseModel):
        values = get_args(_unwrap(bare.model_fields[discriminator].annotation)[0])
        tag = str(values[0]) if values else None
    return tag


def _step(tp: Any, part: Any, place: _Place) -> Any:
    """The type at ``part`` inside ``tp`` (None when unknown), extending ``place``'s text."""
    bare, meta = _unwrap(tp)
    if get_origin(bare) in (Union, types.UnionType):  # pydantic names the member it tried: skip that part
        disc = next((m.discriminator for m in meta if isinstance(m, Discriminator)), None)
        for member in get_args(bare):
            if disc is not None and _member_tag(member, disc) == part:
                place.tag, place.tag_model = str(part), _unwrap(member)[0]
                return member
            if disc is None and str(part).split("[")[0] == getattr(_unwrap(member)[0], "__name__", ""):
                return member
        return None
    if isinstance(bare, type) and issubclass(bare, BaseModel):
        place.model, place.field = bare, bare.model_fields.get(str(part))
        sep = f" ({place.tag})" if place.tag and bare is place.tag_model and place.tag != part and place.text else ""
        place.text += f"{sep}.{part}" if place.text else str(part)
        return place.field.annotation if place.field else None
    if isinstance(part, int):
        place.text += f"[{part}]"
        return get_args(bare)[0] if get_origin(bare) in (list, tuple) and get_args(bare) else None
    place.text += f".{part}" if place.text else str(part)
    return get_args(bare)[1] if get_origin(bare) is dict and len(get_args(bare)) == 2 else None


def _place(model: type[BaseModel] | None, loc: tuple) -> _Place:
    place, tp = _Place(), model
    for part in loc:
        if isinstance(part, str) and part.startswith(_SKIP):
            continue
        tp = _step(tp, part, place)
    return place


def _allowed(values: typing.Iterable[Any]) -> str:
    return ", ".join(map(str, values))


def _message(err: dict[str, Any], place: _Place) -> str:
    """What is wrong, in words: the allowed keys or values, the field's description."""
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    about = f" ({place.field.description})" if place.field is not None and place.field.description else ""
    if kind == "value_error":
        return str(ctx["error"])
    if kind == "missing":
        return f"required{about}"
    if kind == "extra_forbidden":
        key, allowed = str(err["loc"][-1]), sorted(place.model.model_fields) if place.model else []
        where = f" for {place.tag}" if place.tag and place.model is place.tag_model else ""
        return f"unknown key{where}{did_you_mean(key, allowed)}; allowed: {_allowed(allowed)}"
    if kind == "literal_error":
        allowed = [a.strip().strip("'") for a in re.split(r",| or ", ctx["expected"])]
        return f"{quote(value)} is not allowed{did_you_mean(value, allowed)}; allowed: {_allowed(allowed)}"
    if kind in _BOUNDS:
        limit = next(iter(ctx.values()))
        limit = f"{limit:g}" if isinstance(limit, float) else limit
        noun = "an integer" if isinstance(value, int) and isinstance(limit, int) else "a number"
        extra = place.field.json_schema_extra if place.field is not None else None
        noun += f" of {extra['unit']}" if isinstance(extra, dict) and "unit" in extra else ""
        return f"must be {noun} {_BOUNDS[kind]} {limit}{about}, got {quote(value)}"
    if kind == "string_too_short" and ctx.get("min_length") == 1:
        return f"expected a non-empty string{about}, got {quote(value)}"
    if kind == "too_short" and ctx.get("min_length") == 1:
        return f"expected a non-empty {'mapping' if isinstance(value, dict) else 'list'}{about}, got {quote(value)}"
    if kind in ("too_short", "too_long"):
        bound = "at least" if kind == "too_short" else "at most"
        n = ctx.get("min_length", ctx.get("max_length"))
        return f"takes {bound} {n} item{'s' * (n != 1)}{about}, got {quote(value)}"
    word = next((w for k, w in _TYPE_WORDS.items() if kind.startswith(k)), None)
    if word:
        return f"expected {word}{about}, got {quote(value)}"
    if kind in _CUSTOM:  # a message written for this case (e.g. the distributions a search space takes)
        return f"{err['msg']}, got {quote(value)}"
    return f"{err['msg']}{about} (got {quote(value)})"


def _other_branch(text: str, msgs: list[str], deeper: set[str]) -> bool:
    """Whether the errors at ``text`` only say that a union's other type did not fit (``expected a number``) while
    another of its types got further into the value (``deeper``: the key paths that have an error below them):
    those errors are about the deeper keys."""
    return text in deeper and all(m.startswith("expected ") for m in msgs)


def _above(text: str) -> list[str]:
    """The key paths above ``text`` (``a``, ``a.b`` for ``a.b[0]``; the top level, "", for ``[0]``)."""
    return [text[:i] for i, c in enumerate(text) if c in ".["]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def spec_error(
    exc: ValidationError, source: str | os.PathLike, error: type[Exception], model: type[BaseModel] | None = None
) -> Exception:
    """One ``error`` for a pydantic ValidationError of ``model``: ``<file>: <key path>: <what is wrong>; ...``.

    Errors at one key that only say which types a union would take are joined (``expected a number or a
    mapping``)."""
    found: dict[str, list[str]] = {}
    for err in exc.errors():
        place = _place(model, err["loc"])
        msg = _message(err, place)
        if msg.startswith((".", "[")):
            text, msg = f"{place.text}{msg.split(':', 1)[0]}".lstrip("."), msg.split(":", 1)[1].strip()
        else:
            text = place.text
        found.setdefault(text, []).append(msg)
    deeper = {above for text in found for above in _above(text)}
    parts = []
    for text, msgs in found.items():
        if _other_branch(text, msgs, deeper):
            continue
        kinds = [m.split(", got ")[0] for m in msgs]
        if len(msgs) > 1 and all(k.startswith("expected ") for k in kinds):  # a union's types: one message
            about = kinds[0][kinds[0].rfind(" (") :] if kinds[0].endswith(")") else ""
            words = [k.removeprefix("expected ").removesuffix(about) for k in kinds]
            msgs = [f"expected {' or '.join(dict.fromkeys(words))}{about}, got {msgs[0].split(', got ')[-1]}"]
        # a key's text and a message are cut too: a validator's own message may quote a value whole
        text = _cut(text, QUOTE_LIMIT)
        parts += [_cut(f"{text}: {m}" if text else m, 10 * QUOTE_LIMIT) for m in dict.fromkeys(msgs)]
    more = len(parts) - _MAX_PROBLEMS
    if more > 0:
        parts = [*parts[:_MAX_PROBLEMS], f"and {more} more problem{'s' * (more != 1)}"]
    return error(f"{source}: " + "; ".join(parts))
