"""End-to-end tests of `ablate train`: through the CLI's entry point in this process (tests/conftest.py's
``ablate_cli``), and in a fresh interpreter where what it imports is the point."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_train_prints_one_line_per_report(ablate_cli):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread keeps the tiny run fast on a shared machine
    try:
        proc = ablate_cli(
            "train",
            "--set",
            "latent_dim=4",
            "batch_size=64",
            "encoder_widths=[4,4]",
            "report_every=5",
            "eval_samples=256",
            "device=cpu",
            "--steps",
            "10",
        )
    finally:
        torch.set_num_threads(threads)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step=")]
    assert [line.split()[0] for line in lines] == ["step=5", "step=10"], proc.stdout
    for line in lines:
        assert re.search(r" r2=-?\d+\.\d{4} ", line), line
        assert re.search(r" loss=\d+\.\d{4} ", line), line
        assert "r2_lambda_5=" in line and "r2_lambda_25=" in line, line
        assert "mcc=" in line, line
    assert "d=4" in proc.stdout and "batch=64" in proc.stdout
    # g's difficulty once, Λ̂ (sorted, beside the sorted truth) at every report
    assert re.search(
        r"g: layer condition numbers [\d.]+, [\d.]+, [\d.]+ \(threshold [\d.]+\); linear R² of z from g\(z\) [\d.]+",
        proc.stdout,
    ), proc.stdout
    lam_lines = [line for line in proc.stdout.splitlines() if "Λ̂ sorted" in line]
    assert len(lam_lines) == 2 and "true Λ sorted [5 5 25 25]" in lam_lines[0], proc.stdout
    assert "Traceback" not in proc.stderr


def test_bad_value_exits_non_zero_with_a_message(ablate_cli):
    proc = ablate_cli("train", "--set", "latent_dim=1", "--steps", "1")
    assert proc.returncode != 0
    assert "latent_dim" in proc.stderr
    assert "greater than or equal to 2" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "step=" not in proc.stdout


def test_unknown_key_exits_non_zero_and_lists_allowed_keys(ablate_cli):
    proc = ablate_cli("train", "--set", "latent_dims=4", "--steps", "1")
    assert proc.returncode != 0
    assert "latent_dims" in proc.stderr and "allowed keys" in proc.stderr
    assert "Traceback" not in proc.stderr


#: Prints which heavy libraries got imported, after running `ablate train` (or a plain import) in-process.
_PROBE = (
    "import sys\n"
    "{body}\n"
    "heavy = sorted({{m.split('.')[0] for m in sys.modules}} & {{'ray', 'optuna', 'plotly'}})\n"
    "print('HEAVY=' + ','.join(heavy))\n"
)


def _heavy_imports(body: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(body=body)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_train_never_imports_ray_optuna_or_plotly():
    body = (
        "from ablate.cli import main\n"
        "assert main(['train', '--set', 'latent_dim=2', 'encoder_widths=[2]', 'batch_size=8', 'eval_samples=32',"
        " 'report_every=2', 'generator_cond_samples=10', '--steps', '2']) == 0"
    )
    assert _heavy_imports(body) == "HEAVY="


def test_import_ablate_and_its_public_api_stay_free_of_ray():
    body = (
        "import ablate\n"
        "assert ablate.Experiment and ablate.RunConfig and ablate.dgp and ablate.losses and ablate.metrics\n"
        "assert ablate.load_grid('batch_vs_dim', 'smoke').n_trials == 4"
    )
    assert _heavy_imports(body) == "HEAVY="
    # run_grid is public too; it reaches Ray only when called
    assert _heavy_imports("import ablate\nassert callable(ablate.run_grid)") == "HEAVY="
