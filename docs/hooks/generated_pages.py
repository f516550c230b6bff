"""MkDocs hooks: the site's pages that are made from the code at build time, so they cannot drift from it.

- ``index.md``: README.md, its ``docs/…`` links made relative to the site;
- ``grids.md`` and ``grids/<name>.md``: one page per shipped grid from its YAML (what it studies, the paper figure,
  axes, variants, seeds and stop rule per scale, trials per scale) with an SVG of its trials per scale;
- ``cli.md``: every ``ablate`` command's ``--help``, from the argparse parsers.

Used by ``mkdocs.yml`` (``hooks:``); ``make docs`` builds the site with ``--strict``.
"""

from __future__ import annotations

import argparse
import html
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
SCALES = ("smoke", "laptop", "paper")


def on_files(files: Files, config) -> Files:
    """Add the generated pages (and each grid's SVG) to the site's files."""
    for uri, content in generated(config).items():
        files.append(File.generated(config, uri, content=content))
    return files


def generated(config=None) -> dict[str, str]:
    """Every generated page (and image): site path → its text."""
    from ablate.service.specs.grids import known_grids

    pages = {"index.md": home_page(), "cli.md": cli_page(), "grids.md": grids_index(list(known_grids()))}
    for name in known_grids():
        pages[f"grids/{name}.md"], pages[f"grids/{name}.svg"] = grid_page(name)
    return pages


# ----------------------------------------------------------------------------- home
def home_page() -> str:
    """README.md with its links into docs/ made relative to the site (docs/usage.md → usage.md)."""
    text = (ROOT / "README.md").read_text()
    return re.sub(r"\]\(docs/", "](", text)


# ----------------------------------------------------------------------------- grids
def _value(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return str(v)


def _trial_counts(name: str) -> dict[str, int]:
    from ablate.service.specs.grids import load_grid

    return {scale: load_grid(name, scale).n_trials for scale in SCALES}


def grids_index(names: list[str]) -> str:
    from ablate.service.specs.grids import load_grid

    lines = [
        "# Grids",
        "",
        "The grids ablate ships, one page each, made from their YAML files when this site is built. "
        "`ablate list` prints the same table; `ablate show GRID --scale SCALE` prints a grid's resolved settings.",
        "",
        "| grid | figure | trials: smoke | laptop | paper |",
        "|---|---|---:|---:|---:|",
    ]
    for name in names:
        grid, counts = load_grid(name, "laptop"), _trial_counts(name)
        figure = grid.figure.replace("|", "/")
        lines.append(
            f"| [{name}](grids/{name}.md) | {figure} | {counts['smoke']} | {counts['laptop']} | {counts['paper']} |"
        )
    return "\n".join(lines) + "\n"


def grid_page(name: str) -> tuple[str, str]:
    """A grid's page and its SVG (trials per scale)."""
    from ablate.service.specs.grids import load_grid

    counts = _trial_counts(name)
    top = load_grid(name, "laptop")
    lines = [f"# {name}", "", top.description.strip(), "", f"**Figure:** {top.figure or 'none'}", ""]
    lines += [f"![Trials of {name} per scale]({name}.svg)", ""]
    lines += [f"Run it: `ablate run {name} --scale laptop`. Its settings: `ablate show {name} --scale laptop`.", ""]
    for scale in SCALES:
        grid = load_grid(name, scale)
        lines += [f"## {scale.capitalize()} scale", "", f"**{counts[scale]} trials**, search: {grid.search}.", ""]
        rows = [("stop", ", ".join(f"{k} = {_value(v)}" for k, v in grid.stop.model_dump().items() if v is not None))]
        rows += [(f"axis `{axis}`", ", ".join(_value(v) for v in values)) for axis, values in grid.axes.items()]
        if grid.variants:
            rows.append(("variants", ", ".join(f"`{v.name}`" for v in grid.variants)))
        rows.append(("seeds", ", ".join(str(s) for s in grid.seeds)))
        rows += [(f"`{k}`", _value(v)) for k, v in sorted(grid.base.items())]
        lines += ["| setting | value |", "|---|---|", *[f"| {k} | {v.replace('|', '/')} |" for k, v in rows], ""]
    return "\n".join(lines), trials_svg(name, counts)


def trials_svg(name: str, counts: dict[str, int]) -> str:
    """A bar per scale, its length the log of the trial count (the scales differ by orders of magnitude)."""
    import math

    width, bar_h, left = 520, 26, 70
    top = max(math.log10(c + 1) for c in counts.values()) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{len(counts) * (bar_h + 10) + 30}" '
        f'role="img" aria-label="{html.escape(name)}: trials per scale">',
        f'<text x="0" y="16" font-family="sans-serif" font-size="14">{html.escape(name)}: trials per scale</text>',
    ]
    for i, (scale, n) in enumerate(counts.items()):
        y = 28 + i * (bar_h + 10)
        length = max(2.0, (width - left - 80) * math.log10(n + 1) / top)
        parts += [
            f'<text x="0" y="{y + 18}" font-family="sans-serif" font-size="13">{scale}</text>',
            f'<rect x="{left}" y="{y}" width="{length:.0f}" height="{bar_h}" fill="#3f51b5"/>',
            f'<text x="{left + length + 6:.0f}" y="{y + 18}" font-family="sans-serif" font-size="13">{n}</text>',
        ]
    return "\n".join([*parts, "</svg>"]) + "\n"


# ----------------------------------------------------------------------------- CLI
def cli_page() -> str:
    """`ablate --help` and every command's ``--help``, from :func:`ablate.cli.build_parser`."""
    from ablate.cli import build_parser

    parser = build_parser()
    lines = [
        "# CLI reference",
        "",
        "Every `ablate` command and its options, as `--help` prints them (made from the parsers when this site "
        "is built).",
        "",
        "```text",
        _help(parser, "ablate"),
        "```",
    ]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        lines += ["", f"## ablate {name}", "", "```text", _help(sub, f"ablate {name}"), "```"]
    return "\n".join(lines) + "\n"


def _help(parser: argparse.ArgumentParser, prog: str) -> str:
    parser.prog = prog
    import os

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return parser.format_help().rstrip()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
