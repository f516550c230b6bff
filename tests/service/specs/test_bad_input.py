"""Bad input gets one clear line before any compute (issue 23, items 9 to 12): a binary grid, preset or dashboard
file; a run name that would leave --storage; a trial too large for the machine; a --set that replaces an axis;
a --resume whose grid or --set is not the run's. The CLI runs in this process (tests/conftest.py's
``ablate_cli``): every refusal comes before Ray starts, and is checked to start no Ray (Ray not initialised by it, no
`run:` line, nothing written to --storage)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import runs_root, smoke_run

GIB = 1 << 30


@pytest.fixture(scope="module")
def run_dir(ray_session, tmp_path_factory) -> Path:
    """One real smoke run of batch_vs_dim (Ray), shared with tests/reports/test_report.py in the same session."""
    return smoke_run("batch_vs_dim", runs_root(tmp_path_factory))


# ----------------------------------------------------------------------------------------- binary files
def _binary(path: Path) -> Path:
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    return path


@pytest.mark.parametrize("command", ["run", "show"])
def test_a_binary_grid_file_is_one_line(tmp_path, ablate_cli, command):
    grid = _binary(tmp_path / "grid.yaml")
    extra = ["--storage", str(tmp_path / "runs")] if command == "run" else []
    line = ablate_cli(command, str(grid), "--scale", "smoke", *extra).refusal()
    assert line == f"ablate: error: {grid}: not a text file (byte 0x89 at offset 0 is not UTF-8); expected a YAML file"
    assert not (tmp_path / "runs").exists()


def test_a_binary_preset_and_a_control_character_are_one_line(tmp_path, ablate_cli):
    preset = _binary(tmp_path / "preset.yaml")
    line = ablate_cli("run", "batch_vs_dim", "--scale", "smoke", "--preset", str(preset)).refusal()
    assert line.startswith(f"ablate: error: {preset}: not a text file (byte 0x89"), line
    grid = tmp_path / "ctl.yaml"
    grid.write_text("name: ctl\nbase: {lr: \x01}\n")
    line = ablate_cli("show", str(grid)).refusal()
    assert line == f"ablate: error: {grid}: not a YAML text file (character #x0001 at position 21)", line


def test_a_binary_dashboard_spec_is_one_line(run_dir, tmp_path, ablate_cli):
    spec = _binary(tmp_path / "dash.yaml")
    line = ablate_cli("report", str(run_dir), "--dashboard", str(spec), "--out", str(tmp_path / "r.html")).refusal()
    assert line.startswith(f"ablate: error: {spec}: not a text file"), line
    assert not (tmp_path / "r.html").exists()


# ----------------------------------------------------------------------------------------- run names
@pytest.mark.parametrize("name", ["../../escape", "ABSOLUTE", "..", "a/b", "x" * 256, "a\nb", "tab\there"])
def test_a_run_name_is_one_folder_inside_the_storage(tmp_path, name, ablate_cli):
    from ablate.messages import quote

    storage = tmp_path / "deep" / "storage"
    if name == "ABSOLUTE":
        name = str(tmp_path / "elsewhere")
    line = ablate_cli("run", "batch_vs_dim", "--scale", "smoke", "--storage", str(storage), "--name", name).refusal()
    assert line == (
        f"ablate: error: run name {quote(name)} ({len(name.encode())} bytes): a run name is one folder name inside "
        "--storage (not empty, '.' or '..', no '/', '\\' or control characters such as a newline, at most 255 "
        "bytes); choose another --name"
    ), line
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "something was written outside --storage"


def test_resolve_run_dir_refuses_names_that_leave_the_storage(tmp_path):
    from ablate.service.records.rundir import RunError, resolve_run_dir

    assert resolve_run_dir(str(tmp_path), "try-1") == str(tmp_path.resolve() / "try-1")
    for name in ("../x", "/abs", ".", "", "a\\b", "s3://b/x"):
        with pytest.raises(RunError, match="a run name is one folder name"):
            resolve_run_dir(str(tmp_path), name)
    with pytest.raises(RunError):
        resolve_run_dir("s3://bucket/runs", "../other")


# ----------------------------------------------------------------------------------------- memory
def test_batch_size_1e9_is_refused_before_ray_naming_setting_estimate_and_memory(tmp_path, ablate_cli):
    """`--set batch_size=1e9` parses as the integer 10⁹ (YAML 1.2 exponent, pydantic's int), says it replaces
    the batch_size axis, and is refused before Ray starts: the setting, the estimate and the memory available."""
    storage = tmp_path / "runs"
    done = ablate_cli("run", "batch_vs_dim", "--scale", "smoke", "--set", "batch_size=1e9", "--storage", str(storage))
    line = done.refusal()
    assert done.stdout.splitlines()[0] == "--set batch_size=1e9: replaces the grid's axis batch_size (was [16,32])"
    assert "batch_size=1000000000" in line and "needs about" in line and "GiB of memory" in line, line
    assert "available (MemAvailable (psutil)" in line and "lower batch_size" in line, line
    assert not storage.exists()


def test_1e9_is_an_integer_batch_size():
    from ablate.config import RunConfig, parse_assignments

    config = RunConfig.build(parse_assignments(["batch_size=1e9"]), "--set")
    assert config.batch_size == 10**9 and isinstance(config.batch_size, int)


def _peak_rss_mib(config: dict) -> float:
    """VmHWM of a fresh process that builds the experiment, trains 2 steps and evaluates once."""
    script = (
        "import json, sys, torch\nfrom ablate.config import RunConfig\nfrom ablate.core.experiment import Experiment\n"
        "torch.set_num_threads(1)\nexp = Experiment(RunConfig(**json.loads(sys.argv[1])))\nexp.prefetch = False\n"
        "exp.train(2)\nexp.evaluate()\n"
        "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) / 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(config)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM needs Linux /proc")
def test_the_memory_estimate_bounds_a_measured_trial():
    """The estimate is an upper bound of a real trial's peak, and not a wild one: batch 4096 at d = 10 with the
    reference encoder, whose peak is the evaluation's (2B)² logits (docs/performance.md has the calibration)."""
    from ablate.config import RunConfig
    from ablate.service.specs.costs import peak_memory

    config = {"batch_size": 4096, "concentration": 75, "generator_cond_samples": 2000}
    measured = _peak_rss_mib(config)
    estimate = peak_memory(RunConfig(**config)).host / 2**20
    assert measured <= estimate <= 2 * measured, (measured, estimate)


def _grid(batch_sizes: list[int]):
    from ablate.service.specs.grids import load_grid

    grid = load_grid("batch_vs_dim", "smoke")  # axes batch_size × latent_dim [3, 6]
    grid.axes["batch_size"] = batch_sizes
    return grid


def test_check_memory_refuses_a_trial_or_a_concurrency_the_machine_cannot_hold():
    from ablate.service.execution.memory import Machine, MemoryRefused, check_memory
    from ablate.service.specs.costs import peak_memory

    grid = _grid([16, 8192])
    big = max(peak_memory(t.config).host for t in grid.trials)
    machine = Machine(ram=big - 1, ram_source="test machine", cpus=4)
    with pytest.raises(MemoryRefused, match=r"trial batch_size=8192,latent_dim=6,seed=0: needs about .* GiB of memory"):
        check_memory(grid, machine=machine)
    roomy = Machine(ram=big + 1, ram_source="test machine", cpus=4)
    with pytest.raises(MemoryRefused, match=r"4 trials at once .* run fewer at once: --max-concurrent 1"):
        check_memory(grid, machine=roomy)
    check_memory(grid, max_concurrent=1, machine=roomy)  # one at a time fits
    check_memory(grid, machine=Machine(ram=None, ram_source="unknown", cpus=4))  # unknown RAM: no refusal
    check_memory(grid, address="auto", machine=machine)  # a cluster's machines are not known here


def test_check_memory_refuses_a_trial_larger_than_the_gpu():
    from ablate.service.execution.memory import Machine, MemoryRefused, check_memory

    grid = _grid([65536])
    machine = Machine(ram=64 * GIB, ram_source="test machine", gpus=(16 * GIB,), cpus=4)
    with pytest.raises(MemoryRefused, match=r"needs about .* GiB of GPU memory .* than the 16.0 GiB available"):
        check_memory(grid, gpus_per_trial=1, max_concurrent=1, machine=machine)
    check_memory(_grid([1024]), gpus_per_trial=1, max_concurrent=1, machine=machine)


def test_a_set_of_an_axis_is_recorded_and_a_variant_keeps_its_own():
    from ablate.service.specs.grids import load_grid

    grid = load_grid("batch_vs_dim", "smoke")
    assert grid.apply_settings({"batch_size": 64, "lr": 0.01}, "--set", axes_win=False) == []
    assert grid.replaced == {"batch_size": [16, 32]} and grid.overrides == {"batch_size": 64, "lr": 0.01}
    grid = load_grid("anisotropy", "smoke")
    assert grid.apply_settings({"loss": "infonce"}, "--set", axes_win=False) == ["loss"]


# ----------------------------------------------------------------------------------------- the run's record
def test_another_set_or_grid_file_makes_new_points_beside_the_run_s_own(run_dir, tmp_path):
    """Run again into a run (a copy of a real one), the grid as it resolves now decides, point by point: the
    same grid reuses every trial, a --set lr=0.5 makes four new points, a grid file cut to one point reuses it."""
    from ablate.service.records.plan import plan_run
    from ablate.service.specs.grids import grid_from_text, known_grids, load_grid

    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy)
    same = plan_run(load_grid("batch_vs_dim", "smoke"), copy)
    assert len(same.reused) == 4 and not same.units
    other = load_grid("batch_vs_dim", "smoke")
    other.apply_settings({"lr": 0.5}, "--set", axes_win=False)
    new = plan_run(other, copy)
    assert len(new.started) == 4 and not set(new.started) & set(same.reused)
    text = known_grids()["batch_vs_dim"].read_text()
    one = text.replace("batch_size: [16, 32], latent_dim: [3, 6]", "batch_size: [16], latent_dim: [3]")
    cut = plan_run(grid_from_text(one, "smoke", tmp_path / "batch_vs_dim.yaml"), copy)
    assert len(cut.reused) == 1 and cut.reused[0] in same.reused


def test_the_marker_records_every_point_as_its_params_json(run_dir):
    from ablate.service.records.reader import RunReader

    reader = RunReader(run_dir)
    points = reader.points()
    assert len(points) == 4 and reader.disagreeing() == []
    for trial_id, params in points.items():
        assert json.loads((run_dir / f"trial_{trial_id}" / "params.json").read_text()) == params


# ----------------------------------------------------------------------------------------- YAML keys and numbers
_GRID = """name: dup
description: a grid written by a test
base:
  loss: aninfonce
  latent_dim: 2
{base}axes:
  batch_size: [16]
seeds: [0]
stop:
  max_steps: 10
scales:
  smoke: {{}}
  laptop: {{}}
  paper: {{}}
{tail}"""


@pytest.mark.parametrize(
    ("base", "tail", "key", "lines"),
    [
        ("", "seeds: [1, 2]\n", "seeds", (8, 15)),
        ("", "stop:\n  max_steps: 20\n", "stop", (9, 15)),
        ("  concentration: 5\n  concentration: 25\n", "", "concentration", (6, 7)),
    ],
)
def test_a_key_written_twice_is_refused_naming_it_and_both_lines(tmp_path, ablate_cli, base, tail, key, lines):
    grid = tmp_path / "dup.yaml"
    grid.write_text(_GRID.format(base=base, tail=tail))
    line = ablate_cli("run", str(grid), "--scale", "smoke", "--storage", str(tmp_path / "runs")).refusal()
    assert line == (
        f"ablate: error: {grid}: refused: the key {key!r} appears twice, at lines {lines[0]} and {lines[1]}; keep one"
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("base", "setting", "expected"),
    [
        ("  lr: .inf\n", (), "lr: Input should be a finite number"),
        ("  lr: 1e400\n", (), "lr: Input should be a finite number"),
        ("  tau: .inf\n", (), "tau: Input should be a finite number"),
        ("", ("--set", "lr=inf"), "lr: Input should be a finite number"),
        ("", ("--set", "concentration=5/1e400"), "Λ must be a finite number > 0 in every dimension, got inf"),
    ],
)
def test_a_number_that_is_not_finite_is_refused_before_ray(tmp_path, ablate_cli, base, setting, expected):
    grid = tmp_path / "inf.yaml"
    grid.write_text(_GRID.format(base=base, tail=""))
    argv = ["run", str(grid), "--scale", "smoke", "--storage", str(tmp_path / "runs"), *setting]
    line = ablate_cli(*argv).refusal()
    assert line.startswith(f"ablate: error: {grid}: ") and expected in line, line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("marker", "says"),
    [
        ('{"points": {"x": 5}, "grid": 3}', "grid: Input should be a valid string (got 3); points.x: Input should be a valid dictionary (got 5)"),
        ('{"runs": "zzz", "grid": "batch_vs_dim"}', "runs: Input should be a valid list (got 'zzz')"),
    ],
)  # fmt: skip
def test_a_marker_of_the_wrong_shape_is_refused_by_every_command(tmp_path, ablate_cli, marker, says):
    """Valid JSON of the wrong shape gave tracebacks in status and --resume, and export wrote rows from it."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "ablate_run.json").write_text(marker)
    expected = (
        f"ablate: error: {run_dir}/ablate_run.json: not a run marker ablate wrote ({says}); ablate reads only runs "
        "it wrote itself"
    )
    argvs = [
        ["status", str(run_dir)],
        ["export", str(run_dir), "--out", str(tmp_path / "rows.csv")],
        ["run", "batch_vs_dim", "--scale", "smoke", "--storage", str(tmp_path), "--name", "r", "--resume"],
    ]
    for argv in argvs:
        done = ablate_cli(*argv)
        assert done.returncode != 0 and "Traceback" not in done.stderr, (argv, done.stderr)
        assert expected in done.stderr.splitlines(), (argv, done.stderr)
        assert not done.ray_started, argv
    assert not (tmp_path / "rows.csv").exists()
