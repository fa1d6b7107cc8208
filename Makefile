# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BACKEND ?=
PYTEST_ARGS ?=

.PHONY: test lint typecheck pytest demo bench servers venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[all,dev]'
	touch $@

# Installs the database and etcd servers the tests start (Debian packages).
servers:
	bash scripts/ensure-servers.sh

lint: venv
	$(BIN)/ruff check aioelect tests examples bench
	$(BIN)/mypy --strict aioelect examples

pytest: venv servers
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: venv servers lint pytest

# Only a named server backend needs server packages; the default demo uses a lock file.
demo: venv $(if $(filter mysql etcd postgres,$(BACKEND)),servers,)
	$(BIN)/python examples/demo.py $(if $(BACKEND),--backend $(BACKEND),)

# Peers (tooz, etcd3gw...) go into the venv for the benchmarks only, never as dependencies.
bench: venv servers
	$(BIN)/pip install --quiet -r bench/requirements.txt
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
