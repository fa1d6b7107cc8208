"""The overview text agrees with the code: every place that lists the backends names them all, every failover
figure is the one the backends compute, and every count the docs state is the count there is.

The lists come from the code, never from this file: the backends and their variables from
:data:`aioelect._settings.BACKEND_VARIABLES` (the factory's priority order), the values of ``AIOELECT_BACKEND``
from :data:`aioelect._settings.BACKEND_KINDS`, the commands from the ``aioelect`` parser. A backend added there
fails these tests until every overview names it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from aioelect._settings import BACKEND_KINDS, BACKEND_VARIABLES

ROOT = Path(__file__).resolve().parent.parent

#: How prose names each backend kind.
PROSE_NAMES = {"etcd": "etcd", "mysql": "MySQL", "postgres": "PostgreSQL", "redis": "Redis", "file": "file"}
#: The backends a server runs, each with an extra of its own.
SERVER_KINDS = [kind for kind, _ in BACKEND_VARIABLES if kind != "file"]
#: The values `make demo BACKEND=` takes: every kind but the in-memory one (for unit tests, not processes).
DEMO_KINDS = [kind for kind in BACKEND_KINDS if kind != "memory"]


def read(page: str) -> str:
    return (ROOT / page).read_text()


def flat(text: str) -> str:
    """``text`` with its line breaks as spaces, so a sentence is found however it is wrapped."""
    return " ".join(text.split())


def between(text: str, start: str, end: str) -> str:
    found = re.search(re.escape(start) + "(.*?)" + re.escape(end), flat(text))
    assert found is not None, f"no passage from {start!r} to {end!r}"
    return found.group(1)


def test_the_prose_names_cover_every_backend_of_the_code() -> None:
    assert set(PROSE_NAMES) == {kind for kind, _ in BACKEND_VARIABLES}
    extras = re.search(r"\[project\.optional-dependencies\]\n(.*?)\n\[", read("pyproject.toml"), re.S)
    assert extras is not None
    for kind in SERVER_KINDS:
        assert re.search(rf"^{kind} = ", extras.group(1), re.M), f"pyproject.toml has no extra {kind}"


@pytest.mark.parametrize(
    ("page", "start", "end"),
    [
        ("README.md", "aioelect elects that one instance on", "Every backend"),
        ("docs/index.md", "aioelect elects that one instance on", "Every backend"),
        ("pyproject.toml", 'description = "', '"'),
    ],
)
def test_every_overview_names_every_backend(page: str, start: str, end: str) -> None:
    passage = between(read(page), start, end)
    missing = [name for name in PROSE_NAMES.values() if name not in passage]
    assert not missing, f"{page}: the overview ({passage!r}) does not name {missing}"


@pytest.mark.parametrize("page", ["README.md", "docs/index.md", "docs/quickstart.md"])
def test_every_install_line_names_every_extra(page: str) -> None:
    (line,) = [line for line in read(page).splitlines() if line.startswith("pip install 'aioelect[mysql]'")]
    missing = [kind for kind in SERVER_KINDS if f"[{kind}]" not in line]
    assert not missing, f"{page}: the install line does not name the extras {missing}: {line}"


def demo_lists() -> dict[str, list[str]]:
    """Each place that lists the values of `make demo BACKEND=`, with the values it names."""
    lists: dict[str, list[str]] = {}
    for page in ("README.md", "docs/development.md", "Makefile"):
        for found in re.finditer(r"`make demo BACKEND=(\w+)` \(or ([^)]*)\)", flat(read(page))):
            lists[f"{page}: {found.group(0)}"] = [found.group(1), *re.findall(r"`?(\w+)`?(?:,| or |$)", found.group(2))]
    block = re.findall(r"^make demo(?: BACKEND=(\w+))? ", read("docs/development.md"), re.M)
    lists["docs/development.md: the make demo block"] = [kind or "file" for kind in block]
    return lists


def test_every_list_of_demo_backends_names_them_all() -> None:
    from examples.demo import BACKENDS

    assert sorted(BACKENDS) == sorted(DEMO_KINDS), "examples/demo.py runs on a backend list of its own"
    lists = demo_lists()
    assert len(lists) == 4, sorted(lists)
    for where, kinds in lists.items():
        assert sorted(set(kinds)) == sorted(DEMO_KINDS), f"{where} names {kinds}, not {DEMO_KINDS}"


def test_the_quickstart_states_the_factory_order() -> None:
    order = between(read("docs/quickstart.md"), "`aioelect.from_env()` builds the elector from these variables (", ")")
    assert order.split(", then ") == [
        ("the " if kind == "file" else "") + PROSE_NAMES[kind] for kind, _ in BACKEND_VARIABLES
    ], order


def test_the_concepts_rows_of_new_and_from_env_name_every_backend() -> None:
    rows = {row.split(" | ")[0]: row for row in read("docs/concepts.md").splitlines() if row.startswith("| `")}
    (new,) = [row for head, row in rows.items() if head.startswith("| `new(")]
    (from_env,) = [row for head, row in rows.items() if head.startswith("| `from_env(")]
    for kind, variable in BACKEND_VARIABLES:
        assert f"{kind}=None" in new, f"docs/concepts.md: the new() row has no {kind}="
        assert f"`{variable}`" in from_env, f"docs/concepts.md: the from_env() row does not name {variable}"
    kinds = re.search(r"`AIOELECT_BACKEND` \(([^)]*)\)", from_env)
    assert kinds is not None
    assert re.findall(r"`(\w+)`", kinds.group(1)) == list(BACKEND_KINDS), kinds.group(1)


def test_many_jobs_names_every_variable_from_env_reads() -> None:
    usual = between(read("docs/many-jobs.md"), "from the usual variables (", ")")
    for _, variable in BACKEND_VARIABLES:
        assert variable in usual, f"docs/many-jobs.md: the usual variables ({usual}) leave out {variable}"


# --- the commands of `aioelect` ------------------------------------------------------------


def test_the_operations_page_lists_the_commands_there_are() -> None:
    """No count to go stale: the page names the commands, exactly those the parser has."""
    from aioelect.cli._args import build_parser

    commands = sorted(build_parser().commands)
    text = flat(read("docs/operations.md"))
    listed = re.search(r"Installed with the package \(also `python -m aioelect`\)\. Its commands: (.*?):", text)
    assert listed is not None, "docs/operations.md: no sentence listing the commands"
    assert sorted(re.findall(r"`aioelect (\w+)`", listed.group(1))) == commands, listed.group(1)
    for count in ("two", "three", "four", "five", "six"):
        assert f"the {count} commands" not in text.lower() and f"{count} commands:" not in text.lower()
