# make run: create .venv, install, start everything (`mmq up`).
# make test: create .venv, install, run the whole suite.
# make lint: ruff (check, format) and mypy.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean install

install: $(STAMP)

# torch first, from its CPU wheel: later installs then never pull a CUDA build.
$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[dev,asr,image,llm,tune]"
	bash scripts/install_tts.sh $(BIN)
	touch $(STAMP)

run: install
	$(BIN)/mmq up

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

PACKAGES := jobs api workers host cluster common pipelines storage mmq tuning

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict $(PACKAGES)

bench: install
	$(BIN)/python -m bench.overhead

clean:
	rm -rf $(VENV) data build *.egg-info
