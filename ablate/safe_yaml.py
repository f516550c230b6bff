"""YAML read safely: PyYAML's SafeLoader, refusing an alias bomb, a document nested too deep or a key written twice in
one mapping before it is built.

Every grid, preset, dashboard spec and ``--set`` value is read through :func:`yaml_loader`; a refusal is a
:class:`YamlRefused` that the caller turns into one error line naming the file.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ALIAS_LIMIT", "DEPTH_LIMIT", "YamlRefused", "yaml_loader", "yaml_refusal"]


#: How much YAML aliases (``*name``) may add to a spec beyond what its text holds: values plus characters of the
#: text values they repeat. A grid that shares a list between scales adds a few hundred; nine levels of nine
#: aliases each (the "billion laughs") would add billions, and every message or `ablate show` would print them.
ALIAS_LIMIT = 100_000
#: How deeply YAML may nest lists and mappings (a spec nests at most a few levels).
DEPTH_LIMIT = 100


class YamlRefused(ValueError):
    """YAML that parses but that ablate refuses to build: aliases that expand past :data:`ALIAS_LIMIT` (an
    alias bomb), an alias inside the value it names, or lists and mappings nested deeper than
    :data:`DEPTH_LIMIT`. The message says which, without the file's name."""


def yaml_refusal(exc: BaseException) -> str:
    """What to say about YAML that :func:`yaml_loader` refused (a YamlRefused, or the RecursionError of nesting
    too deep for PyYAML's composer, which recurses)."""
    return str(exc) if isinstance(exc, YamlRefused) else f"lists and mappings nest deeper than {DEPTH_LIMIT} levels"


def _check_unique_keys(node: Any) -> None:
    """Raise :class:`YamlRefused` if the mapping ``node`` names a key twice (PyYAML would keep the last one
    silently: a second ``seeds:`` or ``stop:`` would replace the first without a word)."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[str, int] = {}
    for key, _ in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        line = key.start_mark.line + 1
        if key.value in seen:
            raise YamlRefused(f"the key {key.value!r} appears twice, at lines {seen[key.value]} and {line}; keep one")
        seen[key.value] = line


def _check_expansion(root: Any) -> None:
    """Raise :class:`YamlRefused` unless the composed YAML ``root`` is a plain tree once aliases are expanded, at
    most :data:`DEPTH_LIMIT` deep and at most :data:`ALIAS_LIMIT` larger than its nodes counted once each.

    An alias is the very node it names, so one pass over the distinct nodes (each one's expanded size and depth
    from its children's) measures the expansion without building it."""
    import yaml

    def children(node: Any) -> list[Any]:
        if isinstance(node, yaml.MappingNode):
            return [part for pair in node.value for part in pair]
        return list(node.value) if isinstance(node, yaml.SequenceNode) else []

    def own(node: Any) -> int:
        return 1 + len(node.value) if isinstance(node, yaml.ScalarNode) else 1

    size: dict[int, int] = {}  # id(node) -> its size with every alias in it expanded
    depth: dict[int, int] = {}
    open_: set[int] = set()  # nodes whose children are being measured: the path from the root
    written = 0  # every node once, as the text holds it
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_.discard(key)
            below = children(node)
            size[key] = own(node) + sum(size[id(c)] for c in below)
            depth[key] = 1 + max((depth[id(c)] for c in below), default=0)
            if depth[key] > DEPTH_LIMIT:
                raise YamlRefused(f"lists and mappings nest deeper than {DEPTH_LIMIT} levels")
            continue
        if key in size:
            continue
        if key in open_:
            line = node.start_mark.line + 1 if node.start_mark else "?"
            raise YamlRefused(f"the value anchored at line {line} holds an alias (*name) of itself")
        open_.add(key)
        written += own(node)
        _check_unique_keys(node)
        stack.append((node, True))
        stack += [(c, False) for c in children(node)]
    if size[id(root)] - written > ALIAS_LIMIT:
        raise YamlRefused(
            f"its aliases (*name) expand it by more than {ALIAS_LIMIT:,} values and characters "
            "(an alias bomb?); write the repeated values out"
        )


def yaml_loader() -> type:
    """PyYAML's SafeLoader, but reading exponent floats without a dot (``1e-3``, YAML 1.2) as numbers, and
    refusing (:class:`YamlRefused`) a document whose aliases would expand it past :data:`ALIAS_LIMIT`, that
    holds an alias of a value inside that value, that nests deeper than :data:`DEPTH_LIMIT`, or that names a key
    twice in one mapping, before it is built."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        def construct_document(self, node: Any) -> Any:
            _check_expansion(node)
            return super().construct_document(node)

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )
    return Loader
