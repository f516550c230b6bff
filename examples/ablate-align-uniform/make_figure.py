"""The example's main figure from a finished run of its grid: final R² against the batch size, one panel per latent
dimension, one line per loss (mean over seeds), as PNG (drawn by Plotly, photographed by headless Chromium) and a
table of the numbers in Markdown.

    python examples/ablate-align-uniform/make_figure.py RUN_DIR examples/ablate-align-uniform/figure.png
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ablate.analysis.results import load_results

COLOURS = {"align_uniform": "#d62728", "infonce": "#1f77b4", "aninfonce": "#2ca02c"}


def final_r2(run_dir: str):
    """Each trial's last report, then the mean (and count) of final R² per loss, latent dim and batch size."""
    df = load_results(run_dir)
    last = df.sort_values("step").groupby("trial_id").tail(1)
    return (
        last.groupby(["loss_name", "latent_dim", "batch_size"])["r2"]
        .agg(["mean", "count"])
        .reset_index()
        .sort_values(["latent_dim", "loss_name", "batch_size"])
    )


def figure(table) -> go.Figure:
    dims = sorted(table["latent_dim"].unique())
    fig = make_subplots(rows=1, cols=len(dims), subplot_titles=[f"d = {d}" for d in dims], shared_yaxes=True)
    for col, d in enumerate(dims, start=1):
        for loss, colour in COLOURS.items():
            part = table[(table["latent_dim"] == d) & (table["loss_name"] == loss)]
            if part.empty:
                continue
            fig.add_trace(
                go.Scatter(
                    x=part["batch_size"],
                    y=part["mean"],
                    mode="lines+markers",
                    name=loss,
                    line={"color": colour},
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
        batches = sorted(table["batch_size"].unique())
        fig.update_xaxes(type="log", tickvals=batches, ticktext=[str(b) for b in batches], title_text="batch size",
                         row=1, col=col)  # fmt: skip
    fig.update_yaxes(title_text="final R² (linear)", row=1, col=1)
    fig.update_layout(width=1000, height=420, margin={"l": 60, "r": 20, "t": 40, "b": 50}, template="plotly_white")
    return fig


def photograph(html: Path, png: Path, width: int = 1000, height: int = 420) -> None:
    """A PNG of ``html`` taken by headless Chromium."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        raise SystemExit("headless Chromium is needed for the PNG (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}",
             "--virtual-time-budget=10000", f"--window-size={width},{height}", f"--screenshot={png.resolve()}",
             html.resolve().as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("png")
    args = parser.parse_args()
    table = final_r2(args.run_dir)
    png = Path(args.png)
    html = png.with_suffix(".html")
    figure(table).write_html(html, include_plotlyjs=True, full_html=True, config={"displayModeBar": False})
    photograph(html, png)
    html.unlink()
    wide = table.pivot_table(index=["latent_dim", "batch_size"], columns="loss_name", values="mean")
    losses = [c for c in COLOURS if c in wide.columns]
    print("| d | batch | " + " | ".join(losses) + " |")
    print("|---|---|" + "---|" * len(losses))
    for (d, batch), row in wide.iterrows():
        print(f"| {d} | {batch} | " + " | ".join(f"{row[c]:.3f}" for c in losses) + " |")


if __name__ == "__main__":
    main()
