"""The assumptions register (tests/register.py) against the tests it names and the page that shows it."""

from __future__ import annotations

import re

from .register import PAGE, REGISTER, ROOT, page_table, render

#: Rows with no breaking test yet. The number only goes down: a new assumption comes with its test.
OPEN_AT_MOST = 0


def test_every_test_the_register_names_exists() -> None:
    missing = []
    for row in REGISTER:
        for test in ([row.breaks] if row.breaks else []) + list(row.also):
            path, _, name = test.partition("::")
            name, _, case = name.partition("[")  # a parametrized test's case: named in its file as a string
            source = ROOT / path
            text = source.read_text() if source.exists() else ""
            if not re.search(rf"^(async )?def {re.escape(name)}\(", text, re.M) or (
                case and f'"{case[:-1]}"' not in text
            ):
                missing.append(test)
    assert not missing, f"the register names tests that do not exist: {missing}"


def test_the_page_shows_the_register_as_it_is() -> None:
    assert page_table(PAGE.read_text()) == render(), "docs/guarantees.md is stale: run `python -m tests.register`"


def test_every_backend_and_the_supervisor_has_rows() -> None:
    scopes = {row.scope for row in REGISTER}
    wanted = {"every backend", "MySQL / MariaDB", "PostgreSQL", "etcd", "Redis", "Redis Sentinel", "Redis Cluster"}
    assert wanted | {"file", "supervisor"} <= scopes


def test_open_rows_do_not_grow() -> None:
    open_rows = [row.text for row in REGISTER if row.breaks is None]
    assert len(open_rows) <= OPEN_AT_MOST, open_rows
