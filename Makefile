# One-command set-up: a virtualenv with the CPU torch wheel, then ablate and its test extra.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CPU wheel by default; GPU users: make TORCH_SPEC="torch==2.13.0" TORCH_INDEX=https://download.pytorch.org/whl/cu128
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=

.PHONY: setup run test test-fast test-ray-low lint docs clean

$(BIN)/ablate: pyproject.toml examples/ablate-align-uniform/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	$(BIN)/python -m pip install -q --no-deps -e examples/ablate-align-uniform  # the plugin example the tests run
	touch $(BIN)/ablate

setup: $(BIN)/ablate

run: setup
	$(BIN)/ablate run batch_vs_dim

test: setup
	$(BIN)/python -m pytest -q --durations=25

# the inner loop: every test that starts neither Ray nor a browser (a test that starts Ray unmarked fails here)
test-fast: setup
	$(BIN)/python -m pytest -q -m "not ray and not browser" --durations=10

# the lowest Ray ablate supports (pyproject: ray>=2.52): the Ray-marked tests again, in a second venv
RAY_LOW ?= 2.52.0
LOW     := .venv-ray-low/bin
$(LOW)/ablate: pyproject.toml examples/ablate-align-uniform/pyproject.toml
	$(PYTHON) -m venv .venv-ray-low
	$(LOW)/python -m pip install -q --upgrade pip
	$(LOW)/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(LOW)/python -m pip install -q -e ".[test]" "ray[tune,default]==$(RAY_LOW)"
	$(LOW)/python -m pip install -q --no-deps -e examples/ablate-align-uniform
	touch $(LOW)/ablate

# the contract with the lowest Ray: one test per part of Ray's API that ablate uses (a grid through the Tuner with
# ablate's Searcher and callbacks, and no file of Ray's in the run directory; an Optuna search, the ASHA scheduler's
# rungs, a retried trial, SIGTERM and resume, two grids on one Ray, joining a head that `ray start` runs: it has token
# auth on 2.60 and none on 2.52, and ablate must join each in its mode); the rest of the suite checks ablate's own
# logic, which does not change with Ray's version (a resume with Ray's files deleted, for one: Ray writes none there)
RAY_LOW_TESTS ?= "tests/service/execution/test_runner.py::test_every_grid_runs_through_the_cli_at_smoke_scale[batch_vs_dim]" \
	tests/service/execution/test_runner.py::test_an_optuna_grid_stores_its_study_as_a_journal_that_optuna_can_open \
	tests/service/execution/test_rungs.py::test_new_trials_meet_the_rungs_of_the_finished_ones \
	tests/service/execution/test_faults.py::test_trial_that_raises_is_retried_from_its_checkpoint \
	tests/service/execution/test_driver_lock_signals.py::test_sigterm_stops_like_ctrl_c_exit_143_and_resume_completes \
	tests/cli/test_multi_grid.py::test_two_grids_share_one_ray_and_resume_continues_started_grids_and_starts_the_others \
	tests/service/execution/test_cluster.py::test_run_joins_an_existing_cluster
test-ray-low: $(LOW)/ablate
	$(LOW)/python -c "import ray; assert ray.__version__ == '$(RAY_LOW)', ray.__version__"
	$(LOW)/python -m pytest -q -m ray --durations=10 $(RAY_LOW_TESTS)

lint: setup
	$(BIN)/ruff check ablate tests benchmarks examples docs
	$(BIN)/ruff format --check ablate tests benchmarks examples docs

# the docs site (mkdocs.yml): broken links, missing pages and docstrings that do not render fail the build
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .venv-ray-low build/site
