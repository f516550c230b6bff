"""benchmarks/ray_scale.py: the overhead split of a finished run and the bookkeeping benchmark, on real runs."""

import itertools

import pytest
from conftest import runs_root, smoke_run

from ablate.service.records.rundir import RunError
from benchmarks.ray_scale import bench_bookkeeping, list_makespan, longest_first_makespan, run_overhead


def _best_makespan(durations, slots):
    """Brute force over every assignment of trials to slots (the true optimum, for small inputs)."""
    best = float("inf")
    for assign in itertools.product(range(slots), repeat=len(durations)):
        loads = [0.0] * slots
        for d, s in zip(durations, assign):
            loads[s] += d
        best = min(best, max(loads))
    return best


@pytest.mark.parametrize(
    "durations,slots",
    [([387, 357, 143, 93, 60, 30, 20, 11, 10], 2), ([3, 3, 2, 2, 2], 2), ([5, 4, 3, 3, 2, 1], 3), ([7], 4)],
)
def test_longest_first_is_between_the_optimum_and_its_4_3_bound(durations, slots):
    best = _best_makespan(durations, slots)
    lpt = longest_first_makespan(durations, slots)
    assert best - 1e-9 <= lpt <= (4 / 3 - 1 / (3 * slots)) * best + 1e-9  # Graham's bound for LPT
    assert lpt >= max(max(durations), sum(durations) / slots)


def test_longest_first_of_a_known_case():
    # 3,3,2,2,2 on 2 slots: LPT puts 3+2+2 and 3+2 -> 7, while the optimum is 6 (3+3 | 2+2+2)
    assert longest_first_makespan([3, 3, 2, 2, 2], 2) == 7
    assert _best_makespan([3, 3, 2, 2, 2], 2) == 6
    # in the given order: the long trial started last runs alone at the end
    assert list_makespan([1, 1, 1, 1, 4], 2) == 6
    assert list_makespan([4, 1, 1, 1, 1], 2) == 4


def test_overhead_of_a_real_smoke_run(ray_session, tmp_path_factory):
    run_dir = smoke_run("batch_vs_dim", runs_root(tmp_path_factory))
    row = run_overhead(run_dir, slots=2)
    assert row["trials"] == 4
    assert row["wall_s"] >= row["longest_first_s"] * 0.5  # trials overlap at most 2 at a time
    assert row["compute_over_slots_s"] <= row["longest_first_s"]
    assert row["overhead_pct"] == pytest.approx(row["packing_pct"] + row["rest_pct"])


def test_overhead_of_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(RunError, match="not an ablate run directory"):
        run_overhead(tmp_path)


def test_bookkeeping_loses_nothing(ray_session):
    row = bench_bookkeeping(6)
    assert row["finished"] == 6
    assert row["rows"] == row["rows_expected"] == 12
    assert row["duplicated_rows"] == 0
    assert row["files_per_trial"] > 1


def test_cpu_sampler_credits_a_busy_grandchild_to_its_role():
    """benchmarks/ray_cpu.py on a real process tree: a parent whose grandchild burns about 1.5 CPU seconds
    under the log monitor's name; the sampler finds it below the root and credits it to that role."""
    import subprocess
    import sys

    from benchmarks.ray_cpu import role_of, sample_tree

    burn = "import time\nt=time.process_time()\nwhile time.process_time()-t<1.5: pass"
    child = f"import subprocess,sys; subprocess.run([sys.executable,'-c',{burn!r},'log_monitor.py'])"
    proc = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess,sys; subprocess.run([sys.executable,'-c',{child!r}])"]
    )
    used, wall = sample_tree(proc.pid, lambda: proc.poll() is not None, interval=0.1)
    assert proc.returncode == 0
    assert 1.2 <= used.get("log monitor", 0.0) <= 2.0, used  # lost: at most the last 0.1 s before it ended
    assert wall >= 1.5
    assert role_of("/x/ray/core/src/ray/raylet/raylet --dashboard_agent_command=x", False) == "raylet"
    assert role_of("ray::AblateTrainable.train", False) == "trial"
    assert role_of("python -m ablate.cli run g", True) == "driver"
