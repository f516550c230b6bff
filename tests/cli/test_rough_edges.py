"""Rough edges users reported, each refused or handled in one clear line before anything is written, without Ray:

1. a YAML alias bomb ("billion laughs": nine levels of nine aliases, a few hundred bytes) in a grid, preset,
   dashboard or --set is refused naming the file, and no error line quotes a value whole;
2. `ablate run` / `ablate slurm` options outside what they allow (--cpus-per-trial 0, --keep-checkpoints 0,
   --max-concurrent 0, --max-failures -1, --name '') are argparse errors (exit 2) and nothing is written;
3. `ablate export` of a run no trial of which has reported says so (exit 1) and writes no file;
4. `ablate status RUN | head -1` ends quietly (exit 141 when head left first; no BrokenPipeError traceback);
5. a grid whose trials ask for a GPU with the default (adaptive) sampler gets one note line naming
   `--set sampler=fixed`.

Refusals run in this process (tests/conftest.py's ``ablate_cli``); the closed-pipe tests need a process of their own,
and one of them runs the installed `ablate` console script.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ablate import cli
from ablate.config import QUOTE_LIMIT, ConfigError, parse_assignments, quote
from ablate.safe_yaml import ALIAS_LIMIT
from ablate.service.records.rundir import PARAMS_FILE, RESULT_FILE, TRIAL_PREFIX, write_marker
from ablate.service.specs.grids import GridError, load_grid

CLI = [sys.executable, "-m", "ablate.cli"]
#: The console script `pip install` made beside this Python (as conftest.py finds `ray`).
ABLATE = Path(sys.executable).with_name("ablate")

GRID = """name: rough
description: a two-trial grid
figure: none
base: {latent_dim: 2, encoder_widths: [2, 2], eval_samples: 256, report_every: 5, generator_cond_samples: 200,
       batch_size: 16}
seeds: [0]
stop: {max_steps: 10}
scales: {smoke: {}, laptop: {}, paper: {}}
"""


def _bomb(levels: int = 9) -> str:
    """A flow list whose last item is nine to the ``levels`` "lol"s once its aliases are expanded."""
    names = [f"l{i}" for i in range(levels)]
    items = ['&l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    items += [f"&{names[i]} [{', '.join([f'*{names[i - 1]}'] * 9)}]" for i in range(1, levels)]
    return f"[{', '.join(items)}]"


def _error_lines(capsys) -> list[str]:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return [line for line in captured.err.splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------ 1. alias bombs
@pytest.mark.parametrize("where", ["chosen", "axis"])
def test_a_billion_laughs_grid_is_refused_in_one_short_line(tmp_path, capsys, where):
    """`ablate show` of the grid wrote 351 MB (a chosen value printed whole); as an axis its one-line error was
    624 MB. Now the file is refused before anything is built, one line naming it, and show prints nothing."""
    grid = tmp_path / "bomb.yaml"
    if where == "chosen":
        grid.write_text(GRID + f"chosen:\n  - {{key: axes.lr, why: laughs, value: {_bomb()}}}\n")
    else:
        grid.write_text(GRID + f"axes: {{lr: [{_bomb()}]}}\n")
    assert len(grid.read_bytes()) < 1000
    assert cli.main(["show", str(grid), "--scale", "smoke", "--no-generator"]) == 2
    assert capsys.readouterr().out == ""
    assert cli.main(["run", str(grid), "--scale", "smoke", "--storage", str(tmp_path / "runs")]) == 2
    (line,) = _error_lines(capsys)
    assert line == (
        f"ablate: error: {grid}: refused: its aliases (*name) expand it by more than {ALIAS_LIMIT:,} values and "
        "characters (an alias bomb?); write the repeated values out"
    ), line
    assert not (tmp_path / "runs").exists()


def test_presets_dashboards_and_set_values_refuse_alias_bombs_too(tmp_path):
    from ablate.reports.spec import SpecError, load_dashboard
    from ablate.service.specs.presets import PresetError, load_preset

    preset = tmp_path / "laughs.yaml"
    preset.write_text(f"name: laughs\ndescription: {_bomb()}\nsettings: {{lr: 0.001}}\n")
    with pytest.raises(PresetError, match=rf"^{preset}: refused: its aliases \(\*name\) expand it"):
        load_preset(str(preset))
    spec = tmp_path / "dash.yaml"
    spec.write_text(f"grid: batch_vs_dim\ntitle: {_bomb()}\npanels: []\n")
    with pytest.raises(SpecError, match=rf"^{spec}: refused: its aliases \(\*name\) expand it"):
        load_dashboard(spec)
    with pytest.raises(ConfigError, match=r"^--set 'lr': refused: its aliases \(\*name\) expand it"):
        parse_assignments([f"lr={_bomb()}"])
    with pytest.raises(ConfigError, match=r"^--set 'lr': not a YAML value: "):  # was a yaml traceback
        parse_assignments(["lr=[1, 2"])


def test_an_alias_of_itself_and_nesting_too_deep_are_refused(tmp_path):
    selfish = tmp_path / "selfish.yaml"
    selfish.write_text(GRID + "chosen: [{key: x, why: y, value: &me [1, *me]}]\n")
    with pytest.raises(GridError, match=rf"^{selfish}: refused: the value anchored at line 9 holds an alias"):
        load_grid(str(selfish), "smoke")
    for depth in (150, 5000):  # 5000 is too deep even for PyYAML's composer (a RecursionError before)
        deep = tmp_path / f"deep{depth}.yaml"
        deep.write_text(GRID + f"chosen: [{{key: x, why: y, value: {'[' * depth}{']' * depth}}}]\n")
        with pytest.raises(GridError, match=rf"^{deep}: refused: lists and mappings nest deeper than 100 levels$"):
            load_grid(str(deep), "smoke")


def test_aliases_that_share_a_value_still_load(tmp_path):
    """A grid that names its variants once and reuses them in a scale loads as if they were written twice; so
    does one whose aliases repeat a fair amount (a 200-value list, 200 times)."""
    shared = tmp_path / "shared.yaml"
    shared.write_text(
        GRID.replace("scales: {smoke: {}, laptop: {}, paper: {}}", "")
        + "variants: &v [{name: a, loss: infonce}, {name: b, loss: aninfonce}]\n"
        + "scales: {smoke: {variants: *v}, laptop: {}, paper: {}}\n"
    )
    grid = load_grid(str(shared), "smoke")
    assert [v.name for v in grid.variants] == ["a", "b"] and grid.n_trials == 2
    fair = tmp_path / "fair.yaml"
    values = ", ".join(["1"] * 200)
    fair.write_text(GRID + f"chosen: [{{key: x, why: y, value: [&row [{values}], {', '.join(['*row'] * 199)}]}}]\n")
    assert 200 * 200 * 2 < ALIAS_LIMIT  # each "1": one value and one character
    (chosen,) = load_grid(str(fair), "smoke").chosen
    assert len(chosen.value) == 200 and all(row == [1] * 200 for row in chosen.value)


def test_values_in_error_lines_are_cut_short(tmp_path, capsys):
    """A value written out in full (no alias) is quoted cut short, and one error line names at most 10 problems."""
    assert quote("x" * 10) == "'xxxxxxxxxx'"
    assert quote({"linspace": [5, 25]}) == "{'linspace': [5, 25]}"
    long = quote(list(range(1_000_000)))
    assert len(long) <= QUOTE_LIMIT and long.startswith("[0, 1, 2")
    assert len(quote("y" * 100_000)) == QUOTE_LIMIT and quote("y" * 100_000).endswith("…")

    wordy = tmp_path / "wordy.yaml"
    wordy.write_text(GRID.replace("description: a two-trial grid", f"description: [{'y' * 100_000}]"))
    assert cli.main(["show", str(wordy), "--scale", "smoke", "--no-generator"]) == 2
    (line,) = _error_lines(capsys)
    assert line.startswith(f"ablate: error: {wordy}: description: expected a string (what the grid studies), got ['yy")
    assert len(line) < len(str(wordy)) + 400, len(line)

    seeds = tmp_path / "seeds.yaml"
    seeds.write_text(GRID.replace("seeds: [0]", f"seeds: [{', '.join(['a'] * 50_000)}]"))
    assert cli.main(["show", str(seeds), "--scale", "smoke", "--no-generator"]) == 2
    (line,) = _error_lines(capsys)
    assert line.count("expected an integer") == 10 and line.endswith("; and 49990 more problems"), line[-200:]

    axis = tmp_path / "axis.yaml"  # a grid point in the grid's own message: quoted short
    axis.write_text(GRID + f"axes: {{lr: [[{', '.join(['1'] * 50_000)}]]}}\n")
    assert cli.main(["show", str(axis), "--scale", "smoke", "--no-generator"]) == 2
    (line,) = _error_lines(capsys)
    assert len(line) < 600, len(line)
    assert line.startswith(f"ablate: error: {axis}: ") and "lr: Input should be a valid number" in line


# ------------------------------------------------------------------------------------------ 2. run options
BAD_OPTIONS = [
    (["--cpus-per-trial", "0"], "argument --cpus-per-trial: must be a number > 0 (CPUs per trial"),
    (["--cpus-per-trial", "-1"], "argument --cpus-per-trial: must be a number > 0"),
    (["--cpus-per-trial", "nan"], "argument --cpus-per-trial: must be a number > 0"),
    (["--gpus-per-trial", "-0.5"], "argument --gpus-per-trial: must be a number >= 0 (GPUs per trial"),
    (["--keep-checkpoints", "0"], "argument --keep-checkpoints: must be an integer >= 1 (checkpoints kept"),
    (["--max-concurrent", "0"], "argument --max-concurrent: must be an integer >= 1 (trials running at once)"),
    (["--max-failures", "-1"], "argument --max-failures: must be an integer >= 0 (failures a trial may have"),
    (["--name", ""], "argument --name: expected a run name (one folder name inside --storage), got ''"),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS, ids=[" ".join(o) for o, _ in BAD_OPTIONS])
def test_run_options_are_checked_before_anything_is_written(tmp_path, capsys, options, message):
    """These failed with a traceback after Ray had started, leaving a run folder (cpus 0 and -1, keep 0), or were
    taken silently (max-concurrent 0, max-failures -1, an empty name ran under the default name)."""
    storage = tmp_path / "runs"
    with pytest.raises(SystemExit) as done:
        cli.main(["run", "batch_vs_dim", "--scale", "smoke", "--storage", str(storage), *options])
    assert done.value.code == 2
    lines = _error_lines(capsys)
    assert lines[0].startswith("usage: ablate run ")
    assert lines[-1].startswith(f"ablate run: error: {message}"), lines[-1]
    assert not storage.exists()


@pytest.mark.parametrize(
    ("options", "message"), [BAD_OPTIONS[0], BAD_OPTIONS[3], BAD_OPTIONS[-1]], ids=["cpus", "gpus", "name"]
)
def test_slurm_shares_the_checks(tmp_path, ablate_cli, options, message):
    """`ablate slurm` takes the same options through the CLI's entry point: exit 2, no script written."""
    storage = tmp_path / "runs"
    done = ablate_cli("slurm", "batch_vs_dim", "--storage", str(storage), *options)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"ablate slurm: error: {message}"), done.stderr
    assert not storage.exists()
    assert not done.ray_started


def test_good_options_still_parse_into_one_run_options_object():
    from ablate.service.execution.options import RunOptions, options_from_args, resume_words

    args = cli.build_parser().parse_args(
        ["run", "x", "--cpus-per-trial", "0.5", "--gpus-per-trial", "0", "--keep-checkpoints", "1"]
        + ["--max-concurrent", "1", "--max-failures", "0", "--name", "try1", "--pack", "auto", "--set", "lr=0.1"]
    )
    options = options_from_args(args)
    assert (options.cpus_per_trial, options.max_failures, options.pack, options.settings) == (
        0.5,
        0,
        "auto",
        ["lr=0.1"],
    )
    words = resume_words(options)
    assert words[:2] == ["--scale", "laptop"] and "--keep-checkpoints" not in words, words
    assert words[words.index("--set") : words.index("--set") + 2] == ["--set", "lr=0.1"]
    slurm = options_from_args(cli.build_parser().parse_args(["slurm", "x"]))
    assert slurm.gpus_per_trial is None, "decided later, from the nodes' GPUs"
    with pytest.raises(ValueError):
        RunOptions(cpus_per_trial=0)  # the Python API refuses what the CLI refuses


# ------------------------------------------------------------------------------------------ 3. export
def _run_dir(root: Path, trials: int, reported: bool = False) -> Path:
    """A run directory as ablate writes it when its trials have started: the marker, a folder per trial with
    params.json, and (``reported``) one report each."""
    root.mkdir()
    write_marker(str(root), {"grid": "ensemble", "scale": "smoke", "axes": ["variant", "seed"]})
    for i in range(trials):
        trial = root / f"{TRIAL_PREFIX}v{i:04d}_0"
        trial.mkdir()
        (trial / PARAMS_FILE).write_text(json.dumps({"variant": f"v{i:04d}", "seed": 0}))
        if reported:
            (trial / RESULT_FILE).write_text(json.dumps({"training_iteration": 1, "step": 5, "r2": 0.5}) + "\n")
    return root


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_before_any_report_writes_nothing(tmp_path, capsys, suffix):
    """It wrote a CSV of one newline and said "wrote"; now it says there is nothing yet, exits 1 and writes no file
    (an earlier export stays as it was)."""
    run = _run_dir(tmp_path / "run", trials=2)
    out = tmp_path / f"results{suffix}"
    assert cli.main(["export", str(run), "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"ablate: {run}: nothing to export yet: no trial has reported; no file written\n"
    assert not out.exists()
    assert cli.main(["export", str(run)]) == 1
    assert not (run / "results.csv").exists()
    (run / "results.csv").write_text("an earlier export\n")
    assert cli.main(["export", str(run)]) == 1
    assert (run / "results.csv").read_text() == "an earlier export\n"
    capsys.readouterr()

    reported = _run_dir(tmp_path / "reported", trials=2, reported=True)
    assert cli.main(["export", str(reported), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n" and out.stat().st_size > 10


def test_export_help_says_what_happens_before_any_report(capsys):
    for argv in (["--help"], ["export", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert "exit 1, writing nothing, while no trial has reported" in " ".join(capsys.readouterr().out.split())


# ------------------------------------------------------------------------------------------ 4. closed stdout
def test_status_into_a_closed_pipe_exits_quietly(tmp_path):
    """The reader is gone before ablate prints (its output fits the buffer: the last flush meets the pipe)."""
    run = _run_dir(tmp_path / "run", trials=2)
    proc = subprocess.Popen([*CLI, "status", str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # long before the CLI has imported what it needs
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert err == "", err


def test_status_piped_into_head_exits_quietly(tmp_path):
    """`ablate status RUN | head -1` as the user typed it, with the installed `ablate` console script: the first
    line, and whether or not head left before ablate was done, no BrokenPipeError on stderr."""
    assert ABLATE.is_file(), f"no `ablate` console script beside {sys.executable}: `make setup` installs it"
    run = _run_dir(tmp_path / "run", trials=3)
    command = f'{ABLATE} status {run} | head -1; echo "exit=${{PIPESTATUS[0]}}" >&2'
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
    assert done.stdout == f"run: {run}  grid: ensemble (smoke)\n", done.stdout[-500:]
    assert done.stderr in ("exit=0\n", "exit=141\n"), done.stderr[-3000:]


def test_long_output_piped_into_head_exits_quietly(tmp_path):
    """Output larger than a pipe holds (`ablate show` of a grid with 4000 `chosen` entries, about 400 kB: a long
    description is cut to 2000 characters now): head leaves after one line while ablate is still printing, which
    was a BrokenPipeError traceback."""
    grid = tmp_path / "long.yaml"
    entries = "\n".join(f"  - {{key: entry {i}, why: {'a long reason ' * 6}}}" for i in range(4000))
    grid.write_text(GRID + f"chosen:\n{entries}\n")
    command = f'{" ".join(CLI)} show {grid} --scale smoke --no-generator | head -1; echo "exit=${{PIPESTATUS[0]}}" >&2'
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
    assert done.stdout == f"grid: rough  (scale smoke, file {grid})\n", done.stdout[-500:]
    assert done.stderr == "exit=141\n", done.stderr[-3000:]


def test_show_describes_a_few_generators_and_counts_the_rest(tmp_path, capsys):
    """A grid of many seeds, each its own g: `ablate show` builds and describes SHOWN_GENERATORS of them, not all."""
    from ablate.service.specs.grids import resolve_grid_path

    text = (
        resolve_grid_path("batch_vs_dim")
        .read_text()
        .replace("seeds: [0]\n    stop: {max_steps: 10}", "seeds: [0, 1, 2, 3, 4, 5, 6, 7]\n    stop: {max_steps: 10}")
    )
    text = text.replace("  generator_seed: 0 ", "  generator_seed: null ")
    path = tmp_path / "many_g.yaml"
    path.write_text(text)
    assert cli.main(["show", str(path), "--scale", "smoke"]) == 0
    out = capsys.readouterr().out
    described = [line for line in out.splitlines() if line.startswith("  d=")]
    assert len(described) == cli.SHOWN_GENERATORS, out
    assert f"… and {2 * 8 - cli.SHOWN_GENERATORS} more distinct g" in out, out


def test_the_resume_command_names_a_grid_file_by_its_absolute_path(tmp_path, monkeypatch):
    """Printed from one folder, the command must work from any other."""
    from ablate.cli import build_parser
    from ablate.cli.run import resume_command

    (tmp_path / "mine.yaml").write_text("name: mine\n")
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["run", "mine.yaml", "--scale", "smoke", "--storage", "runs"])
    command = resume_command(args)
    assert command.startswith(f"ablate run {tmp_path / 'mine.yaml'} --scale smoke "), command
    assert f"--storage {tmp_path / 'runs'}" in command and command.endswith(" --resume"), command
    shipped = build_parser().parse_args(["run", "batch_vs_dim", "--scale", "smoke", "--storage", "runs"])
    assert resume_command(shipped).startswith("ablate run batch_vs_dim --scale smoke")


def test_show_prints_a_long_description_cut_to_one_readable_line(tmp_path, capsys):
    from ablate import cli
    from ablate.cli import SHOWN_DESCRIPTION

    grid = tmp_path / "long.yaml"
    grid.write_text(
        "name: long\ndescription: " + "x" * 2_000_000 + "\nbase: {loss: aninfonce, latent_dim: 2}\n"
        "axes: {batch_size: [16]}\nseeds: [0]\nstop: {max_steps: 10}\nscales: {smoke: {}, laptop: {}, paper: {}}\n"
    )
    assert cli.main(["show", str(grid), "--scale", "smoke"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("description: ")]
    assert line.endswith("… (2,000,000 characters in all; the grid file holds the rest)")
    assert len(line) < SHOWN_DESCRIPTION + 100


def test_a_gpu_run_with_the_adaptive_sampler_gets_one_note_naming_the_fixed_sampler(tmp_path):
    from ablate.cli.run import sampler_note
    from ablate.service.execution.options import build_options
    from ablate.service.specs.resolve import resolve_grid

    def grid(name, *settings):
        return resolve_grid(name, build_options(scale="smoke", settings=list(settings) or None))

    note = sampler_note(grid("batch_vs_dim"), 0.5)
    assert note.startswith("batch_vs_dim: note: 4 of 4 trials ask for a GPU") and "add --set sampler=fixed" in note
    assert "\n" not in note
    assert sampler_note(grid("batch_vs_dim"), None) is None and sampler_note(grid("batch_vs_dim"), 0.0) is None
    assert sampler_note(grid("batch_vs_dim", "sampler=fixed"), 1.0) is None
    assert sampler_note(grid("zimmermann_sphere"), 1.0) is None  # vMF, or normal without a threshold: no rejection
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(
        "name: mixed\nbase: {latent_dim: 4, batch_size: 16, encoder_widths: [2, 2], generator_cond_samples: 200}\n"
        "variants:\n  - {name: normal}\n  - {name: vmf, conditional: vmf, kappa: 1.0}\nseeds: [0]\n"
        "stop: {max_steps: 10}\nscales: {smoke: {}, laptop: {}, paper: {}}\n"
    )
    note = sampler_note(grid(str(mixed)), 1.0)
    assert note.startswith("mixed: note: 1 of 2 trials") and "give their variants sampler: fixed" in note
