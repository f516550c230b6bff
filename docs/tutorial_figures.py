"""The tutorial's figures: two panels of a run's report (R² during training, final R² heatmap) as PNG files,
drawn by the report's own panel code and photographed by headless Chromium.

    .venv/bin/python docs/tutorial_figures.py scratch/batch_vs_dim-smoke    # writes docs/img/tutorial_*.png
    .venv/bin/python docs/tutorial_figures.py scratch/batch_vs_dim-smoke --out /tmp/img

RUN_DIR is the tutorial's run (docs/tutorial.md); any run of a grid whose report has both panels works.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from ablate.reports.report import build_panels, load_run

#: Report panel kind → PNG file name.
FIGURES = {"r2_curves": "tutorial_r2_curves.png", "final_heatmap": "tutorial_final_heatmap.png"}
WIDTH = 900


def photograph(html: Path, png: Path, width: int, height: int) -> None:
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
    parser.add_argument("--out", default=str(Path(__file__).parent / "img"), help="folder for the PNGs")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    panels = {p.spec.kind: p for p in build_panels(load_run(args.run_dir))}
    for kind, name in FIGURES.items():
        fig = panels[kind].figure
        height = int(fig.layout.height or 450)
        fig.update_layout(width=WIDTH, height=height, margin={"t": 60})
        png = out / name
        with tempfile.TemporaryDirectory() as tmp:
            html = Path(tmp) / "figure.html"
            fig.write_html(html, include_plotlyjs=True, full_html=True, config={"displayModeBar": False})
            photograph(html, png, WIDTH + 16, height + 16)  # the page body has a margin of 8 px
        print(f"wrote {png} ({png.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
