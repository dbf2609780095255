# Two entry points for a fresh clone (see README):  `make demo`  and  `make test`.
# Both create .venv from requirements.lock (exact versions) and are idempotent.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# Quiet, small-machine defaults for Ray (see docs/platform.md).
export RAY_USAGE_STATS_ENABLED ?= 0
export RAY_AUTH_MODE ?= disabled
export RAY_TRAIN_HEALTH_CHECK_INTERVAL_S ?= 0.1
export RAY_DATA_DISABLE_PROGRESS_BARS ?= 1
export AWS_EC2_METADATA_DISABLED ?= true

.PHONY: setup demo browser test test-fast bench clean

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m ncdlr.train_inat2k

# A headless Chromium for the gallery page's browser tests (tests/service/browser.py skips them without one).
browser:
	@if [ -n "$$NCDLR_BROWSER" ] || command -v chromium-headless-shell >/dev/null || command -v chromium >/dev/null; \
	then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y chromium-headless-shell || (apt-get update && apt-get install -y chromium-headless-shell) \
	    || echo "warning: could not install chromium-headless-shell; the browser tests will skip"; \
	else echo "no Chromium on PATH and no root apt-get: the browser tests will skip"; fi

# The suite runs in TEST_WORKERS pytest-xdist processes: its end-to-end tests wait on Ray start-up and actor
# scheduling more than they compute, so two of them share 2 cores well (docs/benchmarks.md, "Test suite").
TEST_WORKERS ?= 2

test: $(STAMP) browser
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=15

test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/bench_ot.py

clean:
	rm -rf $(VENV) .pytest_cache
