"""The overview text agrees with the code: every place that lists the backends names them all, every failover
figure is the one the backends compute, and every count the docs state is the count there is.

The lists come from the code, never from this file: the backends and their variables from
:data:`aioelect.wiring._settings.BACKEND_VARIABLES` (the factory's priority order), the values of ``AIOELECT_BACKEND``
from :data:`aioelect.wiring._settings.BACKEND_KINDS`, the commands from the ``aioelect`` parser. A backend added there
fails these tests until every overview names it.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import re
from pathlib import Path

import pytest

from aioelect.wiring._settings import BACKEND_KINDS, BACKEND_VARIABLES

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
    assert sorted(re.findall(r"`aioelect ([\w-]+)`", listed.group(1))) == commands, listed.group(1)
    for count in ("two", "three", "four", "five", "six"):
        assert f"the {count} commands" not in text.lower() and f"{count} commands:" not in text.lower()


# --- failover at the defaults: one source, the backends' own timing ----------------------------

#: An address per server backend: building an elector connects to nothing.
ADDRESSES = {
    "etcd": "127.0.0.1:1",
    "mysql": "mysql://root@127.0.0.1:1/db",
    "postgres": "postgresql://root@127.0.0.1:1/db",
    "redis": "redis://127.0.0.1:1/0",
}


def failover(kind: str) -> dict[str, float]:
    """The failover figures of ``kind`` at the defaults, from the timing the backend runs on and logs.

    ``lease``: how long the server keeps a silent leader's lock (etcd: the lease's TTL); ``deadline``: when a leader
    without a confirmation fences itself; ``stops``: when a leader cut off from the server stops (the session-lock
    backends see the loss as soon as a check fails, within ``check_interval + 2 * check_timeout``; etcd and Redis
    retry a renewal until the renew deadline).
    """
    import aioelect

    elector = aioelect.new(name="docs/failover", **{kind: ADDRESSES[kind]})
    timing = elector.lock_timing()
    assert timing is not None
    _, lease, deadline = timing
    stops = deadline
    if kind in ("mysql", "postgres"):
        stops = elector._backend.timing.deposed_within  # type: ignore[attr-defined]
    return {"lease": lease, "deadline": deadline, "stops": stops}


def describe_timing(kind: str) -> str:
    """The line the backend logs when it first campaigns."""
    import aioelect

    line: str = aioelect.new(name="docs/failover", **{kind: ADDRESSES[kind]})._backend.describe_timing()
    return line


def s(seconds: float) -> str:
    """Seconds as the docs print them: 10, 3.33."""
    return f"{seconds:.3g}"


def readme_rows() -> list[str]:
    """The README's failover rows of the server backends, as the defaults make them."""
    my, pg, etcd, redis = (failover(kind) for kind in ("mysql", "postgres", "etcd", "redis"))
    return [
        f"| MySQL / MariaDB | `mysql` | milliseconds | `lease` ({s(my['lease'])} s) | stops within {s(my['stops'])} s; "
        f"replaced after `lease` ({s(my['lease'])} s) |",
        f"| PostgreSQL | `postgres` | milliseconds | `lease` ({s(pg['lease'])} s; PostgreSQL 14+) | stops within "
        f"{s(pg['stops'])} s; replaced after `lease` ({s(pg['lease'])} s) |",
        f"| etcd 3.4, 3.5 | `etcd` | about `ttl` ({s(etcd['lease'])} s) | about `ttl` ({s(etcd['lease'])} s) | "
        f"stops at {s(etcd['stops'])} s; replaced after about `ttl` ({s(etcd['lease'])} s) |",
        f"| Redis 7 (Sentinel, Cluster too) | `redis` | `lease` ({s(redis['lease'])} s) | `lease` "
        f"({s(redis['lease'])} s) | stops at {s(redis['stops'])} s; replaced after `lease` ({s(redis['lease'])} s) |",
    ]


def test_the_readme_failover_rows_are_the_backends_defaults() -> None:
    lines = read("README.md").splitlines()
    for expected in readme_rows():
        head = expected.split(" | ")[0]
        (row,) = [line for line in lines if line.startswith(head + " | ")]
        assert row == expected, f"README.md's row must read:\n{expected}"


def backends_rows() -> dict[str, list[str]]:
    """The cells of each server backend's row of docs/backends.md's failover table."""
    text = read("docs/backends.md").split("## Failover at the defaults", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("| "):
            cells = [cell.strip() for cell in line.strip(" |").split(" | ")]
            rows[cells[0]] = cells[1:]
    return rows


def test_the_backends_failover_rows_state_the_backends_defaults() -> None:
    rows = backends_rows()
    header = flat(read("docs/backends.md"))
    for kind, head in (("mysql", "MySQL / MariaDB"), ("postgres", "PostgreSQL")):
        figures = failover(kind)
        crash, freeze, cut = rows[head]
        assert "milliseconds" in crash, (head, crash)
        assert f"after `lease` ({s(figures['lease'])} s)" in freeze, (head, freeze)
        assert f"stops within `check_interval + 2 \u00d7 check_timeout` ({s(figures['stops'])} s)" in cut, (head, cut)
        assert f"leads after `lease` ({s(figures['lease'])} s)" in cut, (head, cut)
    etcd = failover("etcd")
    crash, freeze, cut = rows["etcd"]
    ttl = f"after about `ttl` ({s(etcd['lease'])} s)"
    assert ttl in crash and ttl in freeze, (crash, freeze)
    assert f"renew deadline ({s(etcd['stops'])} s)" in cut and f"after about `ttl` ({s(etcd['lease'])} s)" in cut
    redis = failover("redis")
    crash, freeze, cut = rows["Redis"]
    assert f"after `lease` ({s(redis['lease'])} s)" in crash and f"after `lease` ({s(redis['lease'])} s)" in freeze
    assert f"renew deadline ({s(redis['stops'])} s)" in cut and f"leads after `lease` ({s(redis['lease'])} s)" in cut
    sql = failover("mysql")
    assert (
        f"MySQL and PostgreSQL: `lease={s(sql['lease'])}`, `renew_deadline={s(sql['deadline'])}`" in header
        and f"etcd: `ttl={s(etcd['lease'])}`, renew deadline {s(etcd['deadline'])} s" in header
        and f"Redis: `lease={s(redis['lease'])}`, `renew_deadline={s(redis['deadline'])}`" in header
    ), "docs/backends.md: the defaults the table is computed at"


@pytest.mark.parametrize("kind", ["mysql", "postgres", "etcd", "redis"])
def test_the_runtime_log_states_the_same_figures(kind: str) -> None:
    """The line each backend logs when it first campaigns says what the tables say."""
    figures, line = failover(kind), describe_timing(kind)
    if kind in ("mysql", "postgres"):
        assert f"stops within {figures['stops']:g}s" in line and f"replaced after about {figures['lease']:g}s" in line
        assert f"fences itself after {figures['deadline']:g}s" in line
    else:
        assert f"after {s(figures['lease'])}s" in line or f"after about {s(figures['lease'])}s" in line, line
        assert f"fences itself after {s(figures['deadline'])}s" in line, line


# --- the first fencing token a newcomer sees ------------------------------------------------


def test_the_quickstart_says_what_the_first_token_is_on_every_backend() -> None:
    """Where the quickstart first shows a token, it promises no first value and says per backend what it is."""
    text = flat(read("docs/quickstart.md"))
    assert "prints `leading with token 1`" not in text, "the first token is 1 only on some backends"
    first = between(read("docs/quickstart.md"), "Its first value depends on the backend:", "Compare tokens")
    missing = [name for name in PROSE_NAMES.values() if name not in first]
    assert not missing, f"docs/quickstart.md: the first token is not described for {missing}: {first}"


# --- docs/many-jobs.md: every block defines what it uses ----------------------------------


def undefined_names(source: str) -> set[str]:
    """Names ``source`` reads but neither defines, imports nor gets from the builtins (scopes taken as one)."""
    tree = compile(source, "<block>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    defined, used = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.alias):
            defined.add((node.asname or node.name).split(".")[0])
    return used - defined


def test_every_many_jobs_block_defines_what_it_uses() -> None:
    """A reader can run each block: every name it uses is defined in it, imported from an installed module or
    from a file the page says to save, or (in a fragment) named in the paragraph right above it."""
    text = read("docs/many-jobs.md")
    saved = set(re.findall(r"save it as `(\w+)\.py`", flat(text)))
    blocks = list(re.finditer(r"<!-- docs-test: [^>]*-->\n```python\n(.*?)\n```", text, re.S))
    assert blocks
    for found in blocks:
        source = found.group(1)
        above = flat(text[: found.start()].rstrip().rsplit("\n\n", 1)[-1])
        unexplained = sorted(name for name in undefined_names(source) if f"`{name}`" not in above)
        assert not unexplained, f"docs/many-jobs.md: a block uses {unexplained}, defined nowhere:\n{source}"
        for module in re.findall(r"^from (\w+)(?:\.\w+)* import", source, re.M):
            assert module in saved or importlib.util.find_spec(module), f"docs/many-jobs.md: no module {module}"


def test_the_sentinel_page_states_the_timeout_the_backend_accepts() -> None:
    """docs/redis-sentinel.md's least ``timeout`` is the one the backend refuses below, at the default timing."""
    from aioelect.backends.redis import RedisBackend
    from aioelect.backends.redis._bounds import least_timeout

    least = least_timeout(RedisBackend("redis://127.0.0.1:1/0", name="docs").timing)
    assert f"`timeout 0` (or at least {least:g} s at the default timing)" in flat(read("docs/redis-sentinel.md"))
