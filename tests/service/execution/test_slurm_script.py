"""`ablate slurm` without a cluster: the job's checks, the rendered batch script, and the CLI's output; with a
local folder and with a URI on a real S3 server (moto's, on 127.0.0.1: tests/s3_server.py) as its storage.

The script's behaviour on a real SLURM (start, requeue, resume) is tests/service/execution/test_slurm.py.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import s3_server
from s3_server import fresh_s3_uri

from ablate import cli
from ablate.config import ConfigError
from ablate.service.execution.slurm import (
    job_output,
    render_script,
    script_path,
    slurm_job,
    submit,
    time_seconds,
    write_script,
)
from ablate.service.records.rundir import RunError
from ablate.service.specs.grids import GridError

s3_query = s3_server.s3_query  # the module's S3 server (a fixture), started by the tests that ask for it


def _job(tmp_path, **kwargs):
    return slurm_job("batch_vs_dim", scale="smoke", storage=str(tmp_path), **kwargs)


def test_the_script_asks_slurm_for_the_job_and_runs_the_grid(tmp_path):
    job = _job(tmp_path, nodes=3, gpus_per_node=4, cpus_per_node=16, partition="gpu", time="1-12:00:00",
               settings=["max_steps=3000", "lr=0.001"], pack="auto", name="big")  # fmt: skip
    text = render_script(job)
    assert render_script(job) == text  # pure
    for line in ("#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=16",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu", "#SBATCH --time=1-12:00:00",
                 "#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=B:USR1@",
                 f"#SBATCH --output={tmp_path.resolve()}/big.slurm-%j.out", "export RAY_AUTH_MODE=token"):  # fmt: skip
        assert line in text, line
    run = next(line for line in text.splitlines() if line.startswith("RUN=("))
    for words in ("ablate.cli run batch_vs_dim --scale smoke", "--set max_steps=3000 lr=0.001", "--name big",
                  "--gpus-per-trial 1", "--pack auto", f"--storage {tmp_path.resolve()}"):  # fmt: skip
        assert words in run, words
    if shutil.which("bash"):
        done = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_one_node_binds_the_head_to_loopback_and_a_grid_file_is_named_absolutely(tmp_path, monkeypatch):
    grid_file = Path(__file__).parents[3] / "ablate" / "search_spaces" / "batch_vs_dim.yaml"
    monkeypatch.chdir(grid_file.parent)
    job = slurm_job("batch_vs_dim.yaml", scale="smoke", storage=str(tmp_path), dashboard=False)
    text = render_script(job)
    assert job.grid == str(grid_file.resolve()) and f"run {grid_file.resolve()} --scale smoke" in text
    assert "#SBATCH --gpus-per-node" not in text and "--gpus-per-trial 0" in text and "DASHBOARD=false" in text
    assert job.name == "batch_vs_dim-smoke"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nodes": 0}, "--nodes 0"),
        ({"gpus_per_node": 1, "gpus_per_trial": 2}, "--gpus-per-trial 2"),
        ({"cpus_per_node": 2, "cpus_per_trial": 4}, "--cpus-per-trial 4"),
        ({"time": "3"}, "--time 3: too short"),
        ({"time": "two hours"}, "--time 'two hours'"),
        ({"time": "1:2:3:4"}, "--time '1:2:3:4'"),
        ({"partition": "gpu;rm"}, "--partition 'gpu;rm'"),
        ({"name": "../x"}, "run name '../x'"),
        ({"pack": "many"}, "--pack 'many'"),
        ({"settings": ["no_such_key=1"]}, "no_such_key"),
    ],
)
def test_bad_input_is_one_clear_line_and_writes_nothing(tmp_path, kwargs, message):
    with pytest.raises((ConfigError, RunError, GridError)) as info:
        _job(tmp_path / "s", **kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "s").exists()


def _shell_words(text: str, *names: str) -> list[str]:
    """What bash makes of the script's settings (every line before its body): the values of ``names``, an array
    (``RUN``) word by word."""
    settings = text.split("export RAY_AUTH_MODE=token", 1)[0]
    shown = " ".join(f'"${{{n}[@]}}"' for n in names)
    done = subprocess.run(["bash", "-c", f"{settings}\nprintf '%s\\0' {shown}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\0")[:-1]


def test_a_uri_storage_reaches_the_job_as_typed_and_the_script_lands_in_the_script_dir(tmp_path, s3_query, capsys):
    uri = fresh_s3_uri(s3_query)  # s3://runs/lab/<id>?endpoint_override=127.0.0.1:PORT&scheme=http&region=…
    jobs = tmp_path / "jobs"
    flags = ["batch_vs_dim", "--scale", "smoke", "--storage", uri, "--name", "r", "--set", "max_steps=30"]
    assert cli.main(["slurm", *flags, "--script-dir", str(jobs)]) == 0
    path = jobs.resolve() / "r.sbatch"
    assert f"wrote {path}" in capsys.readouterr().out and sorted(p.name for p in tmp_path.iterdir()) == ["jobs"]
    text = path.read_text()
    assert f"STORAGE={shlex.quote(uri)}" in text and f"--storage {shlex.quote(uri)}" in text  # verbatim, quoted
    assert f"#SBATCH --output={jobs.resolve()}/r.slurm-%j.out" in text
    base, query = uri.split("?")
    storage, run_dir, *run = _shell_words(text, "STORAGE", "RUN_DIR", "RUN")
    assert (storage, run_dir) == (uri, f"{base}/r?{query}")  # the query survives the shell
    # the job's run (and each requeued start's, with --resume added) is what a user types for this run
    from ablate.cli.run import resume_command

    typed = cli.build_parser().parse_args(["run", *flags, "--gpus-per-trial", "0"])
    assert run == [sys.executable, "-m", "ablate.cli", *shlex.split(resume_command(typed))[1:-1]]
    assert resume_command(typed).endswith("--resume") and "--resume" not in run
    done = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    from ablate.service.execution.runner import has_run_state

    assert not has_run_state(uri, "r"), "the check's probe object is gone: the job starts a fresh run"


def test_a_uri_storage_puts_the_script_in_the_current_folder_by_default(tmp_path, s3_query, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = slurm_job("batch_vs_dim", scale="smoke", storage=fresh_s3_uri(s3_query))
    assert script_path(job) == tmp_path.resolve() / "batch_vs_dim-smoke.sbatch"
    assert job_output(job, "7") == f"{tmp_path.resolve()}/batch_vs_dim-smoke.slurm-7.out"
    assert write_script(job) == script_path(job) and sorted(p.name for p in tmp_path.iterdir()) == [
        "batch_vs_dim-smoke.sbatch"
    ]


def test_an_optuna_search_on_a_uri_goes_as_ablate_run_takes_it(tmp_path, s3_query):
    """`ablate slurm` asks of the storage what `ablate run` asks (check_writable), nothing of its own."""
    uri = fresh_s3_uri(s3_query)
    job = slurm_job("tune_aninfonce", scale="smoke", storage=uri, script_dir=str(tmp_path))
    assert f"--storage {shlex.quote(uri)}" in render_script(job)


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda q: fresh_s3_uri(q, bucket="no-such-bucket"), "bucket does not exist"),
        (lambda q: fresh_s3_uri(q) + "&no_such_option=1", "the option 'no_such_option' is not one ablate reads"),
        (lambda q: f"s3:///lab?{q}", "not a bucket's URI"),
        (lambda q: fresh_s3_uri(q).replace("lab/", "lab\n#SBATCH --x/"), "control characters"),
    ],
)
def test_a_bad_uri_is_one_line_naming_it_before_anything_is_written(tmp_path, s3_query, capsys, make, reason):
    uri = make(s3_query)
    with pytest.raises((ConfigError, RunError)) as info:
        slurm_job("batch_vs_dim", scale="smoke", storage=uri, script_dir=str(tmp_path / "jobs"))
    message = str(info.value)
    assert reason in message and "\n" not in message and repr(uri)[1:-1] in message, message  # the URI, named
    assert cli.main(["slurm", "batch_vs_dim", "--scale", "smoke", "--storage", uri, "--script-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and reason in err
    assert list(tmp_path.iterdir()) == []


def test_a_local_storage_with_a_script_dir_keeps_the_run_in_the_storage(tmp_path):
    job = _job(tmp_path / "runs", script_dir=str(tmp_path / "jobs"))
    assert write_script(job) == (tmp_path / "jobs" / "batch_vs_dim-smoke.sbatch").resolve()
    text = script_path(job).read_text()
    assert f"#SBATCH --output={(tmp_path / 'jobs').resolve()}/batch_vs_dim-smoke.slurm-%j.out" in text
    assert f"--storage {(tmp_path / 'runs').resolve()}" in text and not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError, match="--script-dir '/a b'"):
        _job(tmp_path / "runs", script_dir="/a b")


@pytest.mark.parametrize(
    "value, seconds",
    [("30", 1800), ("5:30", 330), ("2:00:00", 7200), ("1-0", 86400), ("1-2:30", 95400), ("0-0:0:5", 5),
     ("UNLIMITED", None)],
)  # fmt: skip
def test_slurm_time_formats(value, seconds):
    assert time_seconds(value) == seconds


def test_write_script_and_a_missing_sbatch(tmp_path):
    job = _job(tmp_path / "runs")
    path = write_script(job)
    assert path == script_path(job) == (tmp_path / "runs" / "batch_vs_dim-smoke.sbatch").resolve()
    assert path.read_text() == render_script(job) and path.stat().st_mode & 0o100
    with pytest.raises(RunError, match="no-such-sbatch: not found; run this on a SLURM login node"):
        submit(path, sbatch="no-such-sbatch")


def test_cli_writes_the_script_and_prints_how_to_submit_it(tmp_path, capsys):
    assert cli.main(["slurm", "batch_vs_dim", "--scale", "smoke", "--storage", str(tmp_path), "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    path = tmp_path.resolve() / "batch_vs_dim-smoke.sbatch"
    assert f"wrote {path}" in out and f"sbatch {path}" in out
    assert "#SBATCH --nodes=2" in path.read_text()
    assert cli.main(["slurm", "batch_vs_dim", "--storage", str(tmp_path / "x"), "--time", "1"]) == 2
    assert "--time 1: too short" in capsys.readouterr().err


def test_the_job_holds_the_run_options_instead_of_declaring_them(tmp_path):
    from dataclasses import fields

    from ablate.service.execution.options import RunOptions

    job = _job(tmp_path, preset="fast", variants=None, settings=["max_steps=30"], cpus_per_trial=2, max_concurrent=3)
    assert not {f.name for f in fields(job)} & set(RunOptions.model_fields), "SlurmJob re-declares a run option"
    assert isinstance(job.options, RunOptions)
    assert (job.options.scale, job.options.preset, job.options.settings) == ("smoke", "fast", ["max_steps=30"])
    assert (job.options.storage, job.options.name) == (str(tmp_path.resolve()), "batch_vs_dim-smoke-fast")
    assert job.options.max_concurrent is None, "`ablate slurm` does not take it: the job's run leaves it out"


def test_a_preset_file_names_the_job_as_it_names_the_run(tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("settings: {lr: 0.01}\n")
    job = _job(tmp_path / "runs", preset=str(preset))  # was refused: the file's path made the run's name
    assert job.name == "batch_vs_dim-smoke-mine"


def test_a_preset_file_given_relative_is_named_absolutely_in_the_script(tmp_path, monkeypatch):
    """The job starts in another folder (SLURM's), so a preset file given relative to this one would not be found
    there: the script's `ablate run` names it by its absolute path, as it names a grid file."""
    (tmp_path / "mine.yaml").write_text("settings: {lr: 0.01}\n")
    monkeypatch.chdir(tmp_path)
    text = render_script(_job(tmp_path / "runs", preset="mine.yaml"))
    assert f"--preset {tmp_path.resolve() / 'mine.yaml'}" in text and "--preset mine.yaml" not in text
    assert "--preset fast" in render_script(_job(tmp_path / "runs", preset="fast")), "a shipped preset stays a name"


def test_a_pack_of_an_optuna_search_is_refused_before_the_script(tmp_path):
    with pytest.raises(RunError, match="--pack 4: tune_aninfonce is an Optuna search"):
        slurm_job("tune_aninfonce", scale="smoke", storage=str(tmp_path / "s"), pack=4)
    assert not (tmp_path / "s").exists()
