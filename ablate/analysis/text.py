"""Plain-text renderings for the terminal: fixed-width tables and one-line summaries of g and Λ̂."""

from __future__ import annotations

from typing import Any

__all__ = ["generator_line", "lambda_hat_line", "text_table"]


def text_table(rows: list[dict[str, Any]]) -> str:
    """A plain fixed-width text table."""
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    text = [[str("" if r.get(c) is None else r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in text)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(t, widths)) for t in text]
    return "\n".join(lines)


def generator_line(stats: dict[str, float]) -> str:
    """One line on how hard g is to invert: threshold, per-layer condition numbers, linear R² of g alone."""
    layers = [v for k, v in sorted(stats.items()) if k.startswith("g_cond_layer_")]
    return (
        f"g: layer condition numbers {', '.join(f'{c:.2f}' for c in layers)} "
        f"(threshold {stats['g_cond_threshold']:.2f}); linear R² of z from g(z) {stats['g_linear_r2']:.3f}"
    )


def lambda_hat_line(lambda_hat: list[float], truth: list[float]) -> str:
    """Λ̂ sorted ascending beside the true Λ sorted ascending (blocks may permute, so compare sorted)."""
    return (
        f"Λ̂ sorted [{' '.join(f'{v:.2f}' for v in sorted(lambda_hat))}]  "
        f"true Λ sorted [{' '.join(f'{v:g}' for v in sorted(truth))}]"
    )
