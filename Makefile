# make run: create .venv, install, start everything (`mmq up`).
# make test: create .venv, install, run the whole suite.
# make lint: ruff (check, format) and mypy.
# make lock: the lock (requirements/*.txt) at the newest versions pyproject's ranges allow,
#   installed, and the suite run on it: an upgrade is a commit of the lock.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test processes (pytest-xdist). 0: one, the default. 2 took 47 min against one's 58 on 2
# cores, with three tests failing under the contention (docs/tests.md).
TEST_PROCS ?= 0

.PHONY: run test lint bench clean install lock

install: $(STAMP)

# Every version from the lock; torch is the CPU wheel (scripts/install.sh says how).
$(STAMP): pyproject.toml requirements/*.txt scripts/install.sh
	PYTHON=$(PYTHON) bash scripts/install.sh --dev $(VENV)
	touch $(STAMP)

lock: install
	bash scripts/lock.sh --upgrade
	$(MAKE) test

run: install
	$(BIN)/mmq up

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_PROCS) --dist loadscope --no-loadscope-reorder --module-durations=15

PACKAGES := jobs jobstore broker telemetry security api workers host cluster common pipelines storage mmq tuning harness scheduler realtime

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict $(PACKAGES)

bench: install
	$(BIN)/python -m bench.overhead

clean:
	rm -rf $(VENV) data build *.egg-info
