"""The words of ablate's one-line errors: :class:`ConfigError`, a value quoted at a bounded length, and the closest
of the allowed names to a misspelt one. No ablate imports: every layer may use them."""

from __future__ import annotations

from typing import Any

__all__ = ["QUOTE_LIMIT", "ConfigError", "describe_validation", "did_you_mean", "quote"]


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and what is allowed."""


#: The most characters of a value that an error message quotes; a longer one is cut and ends in '…'.
QUOTE_LIMIT = 200


def _small(value: Any, limit: int) -> bool:
    """Whether ``value``'s repr is surely short: at most ``limit`` strings, numbers and items, and characters."""
    stack, budget = [value], limit
    while stack:
        item = stack.pop()
        budget -= len(item) if isinstance(item, str | bytes) else 1
        if budget < 0:
            return False
        if isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple | set | frozenset):
            stack += item
    return True


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for an error message, at most ``limit`` characters (a longer one ends in '…'): a value
    written in a spec may be any size, and one error line should stay one line."""
    if isinstance(value, str | bytes):
        text = repr(value[:limit])
    elif _small(value, limit):
        text = repr(value)
    else:  # never build the whole repr of a huge value (a list of a million items, one shared list many times)
        import reprlib

        short = reprlib.Repr()
        short.maxlevel, short.maxstring, short.maxlong, short.maxother = 6, limit, limit, limit
        for kind in ("maxtuple", "maxlist", "maxarray", "maxdict", "maxset", "maxfrozenset", "maxdeque"):
            setattr(short, kind, 20)
        text = short.repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to a misspelt ``word``, or an empty string."""
    import difflib

    if len(str(word)) > 100:  # no spec key or value of ablate's is that long; difflib would take its time
        return ""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def describe_validation(exc, fields) -> str:
    """A pydantic ValidationError as one line: each error's key and rule, an unknown key with the closest of
    ``fields`` and every allowed one, each bad value quoted at a bounded length."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-after")) or "config"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            hint = did_you_mean(err["loc"][-1] if err["loc"] else "", fields)
            msg = f"unknown key{hint}; allowed keys: {', '.join(sorted(fields))}"
        elif "ctx" in err and "error" in err["ctx"]:
            msg = str(err["ctx"]["error"])
        if err["type"] == "extra_forbidden" or loc == "config":
            parts.append(msg if loc == "config" else f"{loc}: {msg}")
        else:
            parts.append(f"{loc}: {msg} (got {quote(err.get('input'))})")
    return "; ".join(parts)
