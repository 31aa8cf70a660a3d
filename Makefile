# JAX Device Kit: every target creates/updates .venv first, so each works on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
LAB_ARGS ?=
STAMP  := $(VENV)/.jax-device-kit-installed
# JupyterLab refuses to start as root (containers, CI) unless told so explicitly.
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
# every notebook under nbval, lax mode, stderr left out (tests/nbval_hooks.py)
NBVAL = $(BIN)/python -m pytest -q -p no:cacheprovider -p tests.nbval_hooks --nbval-lax \
	--nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
	--nbval-cell-timeout=300 notebooks

.PHONY: lab test unit nbval lint doctor notebooks bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

## make lab: JupyterLab on notebooks/ (LAB_ARGS="--no-browser --port 8899" to pass options)
lab: $(STAMP)
	@echo "Starting JupyterLab on notebooks/ - open the http://127.0.0.1:... URL it prints below."
	$(BIN)/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

## make test: unit tests, every notebook under nbval, and ruff
test: $(STAMP)
	$(BIN)/python -m pytest -q tests
	$(NBVAL)
	$(BIN)/ruff check helpers tests benchmarks notebooks

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests

nbval: $(STAMP)
	$(NBVAL)

lint: $(STAMP)
	$(BIN)/ruff check helpers tests benchmarks notebooks

## make doctor: what JAX sees on this machine
doctor: $(STAMP)
	$(BIN)/python -m helpers doctor

## make notebooks: Restart & Run All on every notebook, outputs written back in place
notebooks: $(STAMP)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=300 notebooks/*.ipynb

## make bench: side-by-side benchmarks, results in benchmarks/results/
bench: $(STAMP)
	@ls benchmarks/*.py >/dev/null 2>&1 || { echo "no benchmarks yet"; exit 0; }
	@for f in benchmarks/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
