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


#: What a lent GPU machine lacks beyond Ray (which the offline bundle carries): the dry run blocks their import.
BLOCKED = ("optuna", "plotly")
BLOCKER = f"""import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: the GPU machine has none)")
sys.meta_path.insert(0, _Block())
"""


def _gpu_machine_env(tmp_path: Path) -> dict[str, str]:
    """This machine as a GPU machine's dry run sees it: no CUDA, optuna and plotly missing."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    return {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(blocker),
        "GPU_CHECK_WORK": str(tmp_path / "work"),
    }


@pytest.mark.ray
@pytest.mark.parametrize("part", [1, 2])
def test_each_part_of_the_gpu_check_dry_runs_on_the_cpu(tmp_path, part):
    """Without CUDA each part probes Ray as `ablate run` starts it, says what it skips, writes at most 8 files under
    OUT (no folders), and prints its summary last; with optuna and plotly missing, as on the GPU machine."""
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(out), "--part", str(part)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=_gpu_machine_env(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if torch.cuda.is_available():  # pragma: no cover - CI has no GPU
        pytest.skip("a CUDA device is present")
    assert "import failed" not in proc.stdout, proc.stdout
    assert "ray 2." in proc.stdout and "sees 0 GPU(s)" in proc.stdout
    runs = ["one_trial_per_gpu", "fraction_0.125", "pack8"] if part == 1 else ["claim9", "claim1", "pack_auto_32"]
    for run in runs:
        assert f"Ray sees no GPU: skipping {run}" in proc.stdout
    if part == 1:
        assert "no CUDA device: skipping the matmul limit and the single-trial step" in proc.stdout
    files = [f for f in out.rglob("*")]
    assert len(files) <= 8 and all(f.is_file() and len(f.relative_to(out).parts) <= 3 for f in files), files
    summary = (out / "summary.md").read_text()
    assert len(summary) <= 4000 and proc.stdout.rstrip().endswith(summary.rstrip())
    assert summary.rstrip().endswith(f"part {part}: " + summary.rstrip().rsplit(": ", 1)[-1])


def test_the_summary_keeps_its_pack_table_last_and_within_4000_characters(tmp_path):
    from benchmarks.gpu_lease import Lease, summary

    lease = Lease(tmp_path, 1)
    for i in range(200):
        lease.lines.append(f"line {i}: " + "x" * 60)
    lease.tables["packs: 8 points, wall-clock window"] = [{"run": "pack8", "steps_per_s_wall": 1234.5}]
    lease.tables["single-trial step (reference encoder, AnInfoNCE)"] = [{"batch": 1000, "ms_per_step": 11.7}]
    text = summary(lease, "# header\n")
    assert len(text) <= 4000
    assert text.index("single-trial step") < text.index("packs: 8 points") and "| pack8 | 1234 |" in text
    assert "line 199" in text and "line 0:" not in text  # the oldest lines give way


def test_window_rates_count_wall_clock_and_compute_time_apart():
    from benchmarks.gpu_service import rates

    # two trials training at once for 10 s of wall clock, 8 s of it inside step() each: 2 × 400 steps
    start = {"a": (100, 2.0), "b": (100, 2.0)}
    end = {"a": (500, 10.0), "b": (500, 10.0)}
    wall, compute = rates(start, end, 10.0, expected=2)
    assert wall == pytest.approx(80.0) and compute == pytest.approx(100.0)
    # one trial at a time: the second starts inside the window and counts from zero
    wall, compute = rates({"a": (100, 1.0)}, {"a": (300, 3.0), "b": (200, 2.0)}, 5.0, expected=1)
    assert wall == pytest.approx(80.0) and compute == pytest.approx(100.0)


@pytest.mark.ray
def test_a_timed_run_measures_a_real_run_over_its_window_and_loses_nothing(tmp_path):
    """benchmarks.gpu_service.timed_run on the CPU: a real `ablate run` (a pack of 8, smoke sizes) measured over a
    short window, stopped with Ctrl-C; every trial reported and its log runs 1..N."""
    from benchmarks.gpu_service import GRIDS, RunSpec, timed_run

    spec = RunSpec("cpu_pack8", str(GRIDS / "gpu_pack8.yaml"), ["--scale", "smoke", "--pack", "8", "--gpus-per-trial",
                   "0", "--set", "max_steps=100000", "report_every=50"], expected=8)  # fmt: skip
    row = timed_run(spec, tmp_path, window_s=6, first_report_s=120, stop_s=60)
    assert row["exit"] in (0, 130) and row["note"] == "", row
    assert row["trials"] == "8/8" and row["intact"] and row["ckpt_mib"] > 0
    assert 5 <= row["window_s"] < 15 and row["steps_per_s_wall"] > 0
    assert row["steps_per_s_compute"] >= row["steps_per_s_wall"] * 0.9  # step() time is within the wall clock
