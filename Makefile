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

# the run record's Ray tests (resume, extend, faults, signals, searches): the Ray API ablate uses, end to end
RAY_LOW_TESTS ?= tests/service/test_extend.py tests/service/test_faults.py tests/service/test_checkpoint_integrity.py \
	tests/service/test_driver_lock_signals.py tests/service/test_runner.py tests/service/test_rungs.py tests/cli/test_multi_grid.py
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
