"""Checkpoints written off the training thread (ablate/service/records/checkpoint_writer.py): the same state as a
synchronous write, a copy that training cannot change, errors raised in the trial, and a kill during a write
leaving the checkpoint before it. No Ray: the Trainables' use of it is covered by the fault, signal, extension
and pack tests (tests/service/records/test_checkpoint_integrity.py, test_reliability.py, test_extend.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from ablate.config import RunConfig
from ablate.core.experiment import Experiment
from ablate.service.records.checkpoint_writer import CheckpointWriter
from ablate.service.records.trial import checkpoint_folders, load_state, resume_point, write_checkpoint


def _experiment(steps: int) -> Experiment:
    cfg = RunConfig(
        latent_dim=4, batch_size=16, encoder_widths=[8, 8], eval_samples=64, generator_cond_samples=200, device="cpu"
    )
    exp = Experiment(cfg)
    exp.train(steps)
    return exp


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def test_a_background_write_holds_the_state_of_its_report_not_the_state_after(tmp_path):
    exp = _experiment(3)
    expected = exp.state_dict()
    write_checkpoint(tmp_path / "sync", expected, keep=2)
    writer = CheckpointWriter(tmp_path / "async", keep=2)
    writer.submit(exp.state_dict(), logged=None)
    exp.train(2)  # training goes on while the thread writes: in place, on the same tensors
    writer.wait()
    (sync,), (background,) = checkpoint_folders(tmp_path / "sync"), checkpoint_folders(tmp_path / "async")
    assert background.name == sync.name == "checkpoint_000000003"
    assert _equal(load_state(background), load_state(sync))
    assert not _equal(load_state(background)["encoder"], exp.state_dict()["encoder"])


def test_one_write_at_a_time_keeps_and_prunes_as_the_synchronous_write(tmp_path):
    exp = _experiment(1)
    writer = CheckpointWriter(tmp_path, keep=2)
    for step in range(2, 6):
        exp.train(1)
        writer.submit(exp.state_dict(), logged=step - 1, wait=step == 5)
    names = [p.name for p in checkpoint_folders(tmp_path)]
    assert names == ["checkpoint_000000005", "checkpoint_000000004"], names


def test_an_error_of_a_write_is_raised_in_the_trial(tmp_path):
    blocked = tmp_path / "trial"
    blocked.write_text("a file where the trial's folder should be")
    writer = CheckpointWriter(blocked, keep=2)
    writer.submit(_experiment(1).state_dict(), logged=None)  # returns: the thread fails
    with pytest.raises(OSError):
        writer.wait()
    writer.wait()  # raised once


def test_a_kill_during_a_background_write_leaves_the_checkpoint_before(tmp_path):
    """A process killed while its thread writes a large checkpoint: the earlier checkpoint still loads and the
    resume point is whole (the new one either complete or absent, never a torn file that loads)."""
    child = textwrap.dedent(
        f"""
        import os, signal, torch
        from ablate.service.records.checkpoint_writer import CheckpointWriter
        from ablate.service.records.trial import write_checkpoint
        trial = {str(tmp_path)!r}
        write_checkpoint(trial, {{"step": 5, "w": torch.ones(10)}}, keep=2)
        writer = CheckpointWriter(trial, keep=2)
        writer.submit({{"step": 10, "w": torch.randn(40_000_000)}}, logged=5)  # 160 MB
        while not os.path.isdir(os.path.join(trial, "checkpoint_000000010")):  # serialised: the file write starts
            pass
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    state = resume_point(tmp_path, lambda s: True)
    newer_whole = (tmp_path / "checkpoint_000000010" / "state.pt").is_file()
    assert state is not None and state["step"] == (10 if newer_whole else 5)
    older = next(p for p in checkpoint_folders(tmp_path) if p.name.endswith("05"))
    assert torch.equal(load_state(older)["w"], torch.ones(10))
