"""docs/plugins.md's worked example works as written: its loss module trains, and its grid loads (the plugin named
as ``module:attr``, so nothing is installed into the test environment)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ablate.config import RunConfig
from ablate.core.experiment import Experiment
from ablate.service.specs.grids import load_grid

DOC = Path(__file__).resolve().parents[2] / "docs/plugins.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_s_loss_trains_and_its_grid_loads(tmp_path, monkeypatch):
    (module,) = [b for b in _blocks("python") if "def build(" in b]
    package = tmp_path / "my_losses"
    package.mkdir()
    (package / "__init__.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_losses", None)
    tiny = {"latent_dim": 4, "encoder_widths": [2, 2], "batch_size": 16, "eval_samples": 64}
    config = RunConfig(loss="my_losses:build", loss_options={"tau": 0.2}, generator_cond_samples=50, **tiny)
    exp = Experiment(config)
    exp.train(3)
    assert 0 <= exp.evaluate()["r2"] <= 1

    (grid_text,) = [b for b in _blocks("yaml") if "variants:" in b]
    path = tmp_path / "cosine_vs_batch.yaml"
    path.write_text(grid_text.replace("loss: cosine,", 'loss: "my_losses:build",'))
    grid = load_grid(str(path), "smoke")
    losses = sorted({t.config.loss for t in grid.trials})
    assert losses == ["infonce", "my_losses:build"] and grid.n_trials == 6
