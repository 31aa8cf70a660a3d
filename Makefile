# JAX Device Kit: every target creates/updates .venv first, so each works on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
LAB_ARGS ?=
STAMP  := $(VENV)/.jax-device-kit-installed
# JupyterLab refuses to start as root (containers, CI) unless told so explicitly.
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
# the unit tests and every `>>>` example in the package's docstrings
UNIT = --doctest-modules tests helpers
# every notebook under nbval, lax mode, stderr left out (tests/nbval_hooks.py)
NBVAL_ARGS = -q -p no:cacheprovider -p tests.nbval_hooks --nbval-lax \
	--nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
	--nbval-cell-timeout=300 notebooks
NBVAL = $(BIN)/python -m pytest $(NBVAL_ARGS)

.PHONY: lab test unit nbval lint doctor notebooks bench clean venv gpu-check test-floor test-next next-python \
	test-browser chromium-check

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

## make test: unit tests and the docstring examples, every notebook under nbval, and ruff
test: $(STAMP)
	$(BIN)/python -m pytest -q $(UNIT)
	$(NBVAL)
	$(BIN)/ruff check helpers tests benchmarks notebooks scripts

## make test-floor: the unit tests again on the lowest supported jax (JAX_FLOOR), in a second
## virtualenv (.venv-floor); notebooks run on the newest jax only (make test). CI runs both.
JAX_FLOOR  ?= 0.8.0
FLOOR_VENV ?= .venv-floor
FLOOR_STAMP := $(FLOOR_VENV)/.jax-$(JAX_FLOOR)-installed
$(FLOOR_STAMP): pyproject.toml
	@test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install --quiet -e ".[dev]" "jax==$(JAX_FLOOR)" "jaxlib==$(JAX_FLOOR)"
	@touch $(FLOOR_STAMP)

test-floor: $(FLOOR_STAMP)
	$(FLOOR_VENV)/bin/python -c "import jax; assert jax.__version__ == '$(JAX_FLOOR)', jax.__version__"
	$(FLOOR_VENV)/bin/python -m pytest -q -p no:cacheprovider $(UNIT)

## make test-next: the unit tests and every notebook on a newer jax (JAX_NEXT, e.g. 0.11.2, the
## lent H100's; default the newest pip gives), in a third virtualenv (.venv-next) on Python 3.12:
## jax 0.11 and later need it, and the .venv's Python 3.11 stops at 0.10.2. NEXT_PYTHON is the
## first Python 3.12 that runs (a pyenv shim that refuses is skipped). CI runs 0.11.2 and 0.12.0.1.
NEXT_PYTHON ?= $(shell for p in python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) \
	/usr/bin/python3.12; do $$p -c "" 2>/dev/null && { echo $$p; break; }; done)
NEXT_VENV   ?= .venv-next
JAX_NEXT    ?=
NEXT_STAMP  := $(NEXT_VENV)/.jax-$(or $(JAX_NEXT),newest)-installed
$(NEXT_STAMP): pyproject.toml
	@test -n "$(NEXT_PYTHON)" || { echo "no Python 3.12 runs here: set NEXT_PYTHON=/path/to/python3.12"; exit 1; }
	@test -x $(NEXT_VENV)/bin/python || $(NEXT_PYTHON) -m venv $(NEXT_VENV)
	$(NEXT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(NEXT_VENV)/bin/python -m pip install --quiet -e ".[dev]" \
	    $(if $(JAX_NEXT),"jax==$(JAX_NEXT)" "jaxlib==$(JAX_NEXT)",--upgrade jax jaxlib)
	@rm -f $(NEXT_VENV)/.jax-*-installed  # one stamp: the jax installed now
	@touch $(NEXT_STAMP)

next-python:
	@echo $(NEXT_PYTHON)

test-next: $(NEXT_STAMP)
	$(NEXT_VENV)/bin/python -c "import jax, sys; print('jax', jax.__version__, 'on Python', \
	    sys.version.split()[0]); assert '$(JAX_NEXT)' in ('', jax.__version__), jax.__version__"
	$(NEXT_VENV)/bin/python -m pytest -q -p no:cacheprovider $(UNIT)
	$(NEXT_VENV)/bin/python -m pytest $(NBVAL_ARGS)

## make test-browser: JupyterLab in headless Chromium, as a learner uses it: Restart & Run All on
## every notebook (no error output, no stderr traceback, every cell run), the MemoryMonitor widget
## live (Start, refreshes, Stop); screenshots and the server log in tests/artifacts/. Needs the
## system Chromium (CHROMIUM, default /usr/bin/chromium: `apt-get install chromium`; .ci/run
## installs it); installs Playwright (the `browser` extra) into .venv, never its browsers.
CHROMIUM ?= /usr/bin/chromium
BROWSER_STAMP := $(VENV)/.browser-extra-installed
$(BROWSER_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[dev,browser]"
	@touch $(BROWSER_STAMP)

chromium-check:
	@test -x "$(CHROMIUM)" || { \
	  echo "make test-browser: no Chromium at $(CHROMIUM)."; \
	  echo "  Install the system package: apt-get install chromium   (Debian, as root or with sudo)"; \
	  echo "  or name another binary:     make test-browser CHROMIUM=/path/to/chromium"; \
	  exit 1; }

test-browser: chromium-check $(BROWSER_STAMP)
	CHROMIUM="$(CHROMIUM)" $(BIN)/python -m pytest -q -p no:cacheprovider tests/browser

unit: $(STAMP)
	$(BIN)/python -m pytest -q $(UNIT)

nbval: $(STAMP)
	$(NBVAL)

lint: $(STAMP)
	$(BIN)/ruff check helpers tests benchmarks notebooks scripts

## make doctor: what JAX sees on this machine
doctor: $(STAMP)
	$(BIN)/python -m helpers doctor

## make notebooks: Restart & Run All on every notebook, outputs written back in place
notebooks: $(STAMP)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=300 notebooks/*.ipynb

## make bench: side-by-side benchmarks, results in benchmarks/results/
bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	@ls benchmarks/*.py >/dev/null 2>&1 || { echo "no benchmarks yet"; exit 0; }
	@for f in benchmarks/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

## make gpu-check: on a machine with an NVIDIA GPU, run the GPU paths (every notebook, the real
## OOM, allocator settings, gpu tests, benchmarks) and record them in docs/gpu-runs/. Exits 2 at once
## without a GPU. GPU_NOVENV=1 uses $(PYTHON) as it is (it must already have jax[cuda12|13]);
## GPU_WHEELS is a wheel folder for offline installs (scripts/fetch_gpu_wheels.sh fills it);
## GPU_STEPS picks steps, e.g. GPU_STEPS=tests,reproduce; GPU_DEADLINE=540 bounds the call (s).
GPU_WHEELS ?= .gpu-wheels
GPU_STEPS  ?= all
GPU_LIMIT   = $(if $(GPU_DEADLINE),--deadline $(GPU_DEADLINE))
gpu-check:
	@$(PYTHON) scripts/gpu_check.py --detect-only
ifeq ($(GPU_NOVENV),1)
	$(PYTHON) scripts/gpu_check.py --python $(PYTHON) --wheels $(GPU_WHEELS) --steps $(GPU_STEPS) $(GPU_LIMIT)
else
	$(MAKE) venv
	$(BIN)/python -m pip install --quiet -e ".[dev,cuda13]"
	$(BIN)/python scripts/gpu_check.py --wheels $(GPU_WHEELS) --steps $(GPU_STEPS) $(GPU_LIMIT)
endif

clean:
	rm -rf $(VENV) $(FLOOR_VENV) .pytest_cache .ruff_cache *.egg-info
