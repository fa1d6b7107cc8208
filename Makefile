# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BACKEND ?=
PYTEST_ARGS ?=
# The interpreter matrix (noxfile.py) skips a Python it cannot find; in CI a missing one fails the run.
CI_TRUE := $(filter true 1 yes,$(shell echo '$(CI)' | tr A-Z a-z))
NOX_ARGS ?= $(if $(CI_TRUE),--error-on-missing-interpreters,--no-error-on-missing-interpreters)

.PHONY: test lint typecheck pytest matrix demo bench servers venv clean

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
	$(BIN)/ruff check aioelect tests examples bench noxfile.py
	$(BIN)/mypy --strict aioelect examples noxfile.py

pytest: venv servers
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The tests that need no server, on every supported Python found (3.10 to 3.13); see noxfile.py.
matrix: venv
	$(BIN)/nox $(NOX_ARGS) --reuse-venv yes -s matrix

# The whole suite last: its summary line closes the log.
test: venv servers lint matrix pytest

# Only a named server backend needs server packages; the default demo uses a lock file.
demo: venv $(if $(filter mysql etcd postgres,$(BACKEND)),servers,)
	$(BIN)/python examples/demo.py $(if $(BACKEND),--backend $(BACKEND),)

# Peers (tooz, etcd3gw...) go into the venv for the benchmarks only, never as dependencies.
bench: venv servers
	$(BIN)/pip install --quiet -r bench/requirements.txt
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .nox .pytest_cache .mypy_cache .ruff_cache
