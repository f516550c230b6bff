"""The prepared GPU check (benchmarks/gpu_check.py) on a CPU machine, and its batched-model alternative."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ablate.core.losses import AnInfoNCE
from benchmarks.batched import BatchedAnInfoNCEModels, batched_aninfonce_loss

ROOT = Path(__file__).resolve().parents[1]


def test_batched_loss_is_the_sum_of_each_models_aninfonce():
    gen = torch.Generator().manual_seed(0)
    k, b, d = 3, 16, 4
    h1 = torch.nn.functional.normalize(torch.randn(k, b, d, generator=gen, dtype=torch.float64), dim=-1)
    h2 = torch.nn.functional.normalize(torch.randn(k, b, d, generator=gen, dtype=torch.float64), dim=-1)
    lam = (torch.rand(k, d, generator=gen) * 20 + 1).double()  # float32 values: AnInfoNCE stores a fixed Λ̂ as float32
    expected = sum(AnInfoNCE(d, lam[i].tolist()).double()(h1[i], h2[i]) for i in range(k))
    assert float(batched_aninfonce_loss(h1, h2, lam)) == pytest.approx(float(expected), rel=1e-10)


def test_batched_models_train_independently():
    torch.manual_seed(0)
    models = BatchedAnInfoNCEModels(2, d=4, batch=64, concentration=[5.0, 5.0, 25.0, 25.0])
    before = [w.detach().clone() for w in models.weights]
    models.train(3)
    assert all(not torch.equal(a, w) for a, w in zip(before, models.weights))
    # model 1's gradient does not depend on model 0's parameters: perturb model 0, model 1's grad is unchanged
    loss = models.loss
    models.optimizer.zero_grad()
    models.rng.manual_seed(5)
    loss().backward()
    g1 = models.weights[0].grad[1].clone()
    models.optimizer.zero_grad()
    with torch.no_grad():
        models.weights[0][0] += 0.1
    models.rng.manual_seed(5)
    loss().backward()
    assert torch.allclose(models.weights[0].grad[1], g1, atol=1e-6)


def test_gpu_check_without_cuda_skips_every_part_and_needs_no_ray(tmp_path):
    code = (
        "import sys; from benchmarks.gpu_check import main; rc = main([sys.argv[1], '--quick']); "
        "print('RAY_IMPORTED' if any(m.split('.')[0] in ('ray', 'optuna', 'plotly') for m in sys.modules) else 'NO_RAY');"
        "rc = rc or main([sys.argv[1] + '/c9', '--quick', '--only', 'claim9']); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    if torch.cuda.is_available():  # pragma: no cover - CI has no GPU
        pytest.skip("a CUDA device is present")
    for part in (
        "the GPU's matmul limit",
        "the training step",
        "packing trials on one GPU",
        "the science at GPU speed",
        "claim 9 at the reference batch",
    ):
        assert f"no CUDA device: skipping {part}" in proc.stdout
    assert "NO_RAY" in proc.stdout
    assert (tmp_path / "gpu_check.md").read_text().startswith("# ablate GPU check: no CUDA device")
    assert json.loads((tmp_path / "gpu_check.json").read_text())["device"] == "no CUDA device"


@pytest.mark.ray
def test_gpu_service_runs_ray_smoke_for_real_and_says_what_it_skips_without_cuda(tmp_path):
    """The service parts of the GPU check: the Ray smoke run is a real `ablate run --no-dashboard` (also here);
    the GPU parts skip without CUDA and say so."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_service", str(tmp_path), "--budget", "5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Ray Tune runs here" in proc.stdout
    for part in ("pack", "claim9", "claim1"):
        assert f"no CUDA device: skipping the service's {part} part" in proc.stdout
    (smoke,) = json.loads((tmp_path / "gpu_service.json").read_text())["ray_smoke"]
    assert smoke["exit"] == 0 and smoke["trials_reporting"] == 4 and smoke["reports_intact"]
