"""A researcher's own loss, conditional, generator or encoder, installed as an ordinary Python package.

A distribution declares an entry point in one of :data:`GROUPS` (``ablate.losses``, ``ablate.conditionals``,
``ablate.generators``, ``ablate.encoders``); its name is the name a grid uses (``loss: my_loss``) and its object is
a factory (the signatures are in :mod:`ablate.core.parts` and docs/plugins.md). A grid may also name a
factory directly as ``"package.module:attr"``. Either way the package must be installed: ablate imports modules by
name, never from a file path, and a grid that names a plugin runs that package's code.

This module finds plugins and reports, in one line, a name that is unknown (the built-in and installed names, the
closest suggested) or a factory that refuses its options (the plugin, its distribution and the option). It knows
names only; the built-in parts live in :mod:`ablate.core`.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

__all__ = [
    "GROUPS",
    "Plugin",
    "PluginError",
    "call_factory",
    "check_name",
    "installed_names",
    "is_plugin_name",
    "load",
    "resolve",
]

#: The entry-point group of each kind of part.
GROUPS = {
    "loss": "ablate.losses",
    "conditional": "ablate.conditionals",
    "generator": "ablate.generators",
    "encoder": "ablate.encoders",
}


class PluginError(ValueError):
    """A plugin that cannot be found, loaded or built; the message is one line naming it."""


@dataclass(frozen=True)
class Plugin:
    """A resolved plugin: its kind and name, its factory, and the distribution (and version) that provides it."""

    kind: str
    name: str
    factory: Callable[..., Any]
    distribution: str | None
    version: str | None

    def describe(self) -> str:
        """``loss 'name' (distribution 1.0)``, for messages."""
        dist = f" ({self.distribution} {self.version})" if self.distribution else ""
        return f"{self.kind} {self.name!r}{dist}"

    def provenance(self) -> dict[str, Any]:
        """What a run's provenance records of the plugin."""
        return {"kind": self.kind, "name": self.name, "distribution": self.distribution, "version": self.version}


@functools.cache
def _entry_points(kind: str) -> dict[str, metadata.EntryPoint]:
    """The installed entry points of ``kind``'s group, read once per process (a grid validates a config per
    point, and reading every distribution's metadata takes milliseconds)."""
    return {ep.name: ep for ep in metadata.entry_points(group=GROUPS[kind])}


def installed_names(kind: str) -> list[str]:
    """The names installed distributions declare in ``kind``'s entry-point group, sorted."""
    return sorted(_entry_points(kind))


def is_plugin_name(name: str) -> bool:
    """Whether ``name`` has the ``package.module:attr`` form of a factory named directly."""
    module, sep, attr = name.partition(":")
    return bool(sep) and all(p.isidentifier() for p in module.split(".")) and attr.isidentifier()


def check_name(kind: str, name: Any, builtin: Iterable[str]) -> str:
    """``name`` if it is a built-in name of ``kind``, an installed one, or ``module:attr``; else PluginError."""
    builtin = list(builtin)
    if isinstance(name, str) and (name in builtin or is_plugin_name(name) or name in _entry_points(kind)):
        return name
    installed = installed_names(kind)
    close = difflib.get_close_matches(str(name), [*builtin, *installed], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise PluginError(
        f"unknown {kind} {name!r}: built-in {', '.join(builtin) or 'none'}; installed ({GROUPS[kind]}) "
        f"{', '.join(installed) or 'none'}; or a factory named as 'package.module:attr'{hint}"
    )


@functools.lru_cache(maxsize=64)
def load(kind: str, name: str) -> Plugin:
    """:func:`resolve`, once per process for each kind and name."""
    return resolve(kind, name)


def resolve(kind: str, name: str) -> Plugin:
    """The installed plugin ``name`` of ``kind`` (an entry point, or ``module:attr``), loaded."""
    if is_plugin_name(name):
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
            factory = getattr(module, attr)
        except (ImportError, AttributeError) as exc:
            raise PluginError(f"{kind} {name!r}: cannot load it: {type(exc).__name__}: {exc}") from None
        dist = _distribution_of(module_name)
    else:
        ep = _entry_points(kind).get(name)
        if ep is None:
            check_name(kind, name, [])
        try:
            factory = ep.load()
        except Exception as exc:  # noqa: BLE001 - a plugin's import error, in one line naming it
            raise PluginError(
                f"{kind} {name!r} ({GROUPS[kind]} entry point {ep.value}): cannot load it: {type(exc).__name__}: {exc}"
            ) from None
        dist = ep.dist.name if ep.dist is not None else None
    if not callable(factory):
        raise PluginError(f"{kind} {name!r}: {factory!r} is not a factory (a callable)")
    version = _version(dist)
    return Plugin(kind, name, factory, dist, version)


def call_factory(plugin: Plugin, *args: Any, options: dict[str, Any] | None = None) -> Any:
    """``plugin.factory(*args, **options)``; a factory that refuses its options becomes one PluginError line
    naming the plugin, its distribution and the option."""
    options = dict(options or {})
    try:
        inspect.signature(plugin.factory).bind(*args, **options)
    except TypeError as exc:
        raise PluginError(f"{plugin.describe()}: bad {plugin.kind}_options {sorted(options)}: {exc}") from None
    except ValueError:  # a callable without a signature (a builtin): let the call say
        pass
    try:
        return plugin.factory(*args, **options)
    except (TypeError, ValueError, KeyError) as exc:
        named = [k for k in options if k in str(exc)]
        which = f"option {named[0]!r}" if named else f"{plugin.kind}_options {options}"
        raise PluginError(f"{plugin.describe()}: refused {which}: {type(exc).__name__}: {exc}") from None


def _distribution_of(module_name: str) -> str | None:
    top = module_name.split(".")[0]
    names = metadata.packages_distributions().get(top) or []
    return names[0] if names else None


def _version(dist: str | None) -> str | None:
    if dist is None:
        return None
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
