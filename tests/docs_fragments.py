"""The harnesses that run the docs' fragments: lines around names a page introduces in prose.

A fragment is marked ``<!-- docs-test: fragment NAME -->``; :data:`HARNESSES`
has a :class:`Harness` of that name. The harness builds a whole program
around the block as printed: it defines the names the prose introduces (an
``elector``, a database ``db``, the ``tenants``...), puts the servers of the
test harness where the block names a server or a file, runs it on a real
backend and prints what the block did, which tests/test_docs.py checks.
Nothing of the block is left out or rewritten but those addresses, a port
the page names (a free one instead), and a ``...`` that stands for the
user's code (code that shows the block's effect instead).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["HARNESSES", "Harness"]

_ASYNC_MAIN = """\
import asyncio
import os
import sys

import anyio

import aioelect


async def main() -> None:
{body}


asyncio.run(main())
"""


def _indent(source: str, depth: int = 1) -> str:
    return textwrap.indent(source, "    " * depth)


def _statements(block: str) -> list[str]:
    """The block's top-level statements, each with its indented lines."""
    statements: list[str] = []
    for line in block.splitlines():
        if line[:1].isspace() and statements:
            statements[-1] += "\n" + line
        elif line.strip():
            statements.append(line)
    return statements


def _acquire_timeout(block: str, ctx: dict[str, str]) -> str:
    """Each of the three ways in turn on one elector: each must lead within its 30 s, then the harness releases."""
    steps = [
        f'{statement}\nprint(f"way {way}: leading with token {{lead.token}}", flush=True)\nawait lead.release()'
        for way, statement in enumerate(_statements(block), 1)
    ]
    body = "async with aioelect.from_env() as elector:\n" + _indent("\n".join(steps))
    return _ASYNC_MAIN.format(body=_indent(body))


def _fencing_write(block: str, ctx: dict[str, str]) -> str:
    """``db`` is the application's MariaDB database (``APP_DATABASE``) with a ``jobs`` row; afterwards the row shows
    the token, and a write under an older token matches no row."""
    setup = """\
import random
import warnings
from urllib.parse import unquote, urlsplit

import aiomysql

warnings.filterwarnings("ignore", message=".*already exists")  # the jobs table of an earlier run

parts = urlsplit(os.environ["APP_DATABASE"])  # the application's own MariaDB, whatever backend elects
link = await aiomysql.connect(
    host=parts.hostname, port=parts.port, user=unquote(parts.username or ""),
    password=unquote(parts.password or ""), db=parts.path.lstrip("/"), autocommit=True,
)


class Database:  # the application's database: execute() returns the rows written
    async def execute(self, sql: str, params: tuple[object, ...]) -> int:
        async with link.cursor() as cursor:
            return int(await cursor.execute(sql, params))


db = Database()
await db.execute(
    "CREATE TABLE IF NOT EXISTS jobs (id BIGINT PRIMARY KEY, state VARCHAR(20), fence BIGINT NOT NULL)", ()
)
job_id = random.randrange(1, 2**62)
await db.execute("INSERT INTO jobs (id, state, fence) VALUES (%s, 'queued', 0)", (job_id,))
elector = aioelect.from_env()
"""
    after = """\
async with link.cursor() as cursor:
    await cursor.execute("SELECT state, fence FROM jobs WHERE id = %s", (job_id,))
    state, fence = await cursor.fetchone()
print(f"job {job_id}: {state} with fence {fence}, token {lead.token}", flush=True)
late = await db.execute(
    "UPDATE jobs SET state = 'dispatched', fence = %s WHERE id = %s AND fence <= %s",
    (lead.token - 1, job_id, lead.token - 1),
)
print(f"a write under token {lead.token - 1} matched {late} rows", flush=True)
await elector.aclose()
link.close()
"""
    return _ASYNC_MAIN.format(body=_indent(setup + block + "\n" + after))


def _fenced_store(block: str, ctx: dict[str, str]) -> str:
    """``elector`` from the environment (on PostgreSQL with ``AIOELECT_SCHEMA``, as the page says); afterwards the
    state shows the tick and the cursor, and a write under the released leadership is refused."""
    setup = """\
if "AIOELECT_POSTGRES_DSN" in os.environ:
    os.environ["AIOELECT_SCHEMA"] = "public"  # fenced state checks the token row of the leaders table
elector = aioelect.from_env()
"""
    after = """\
print(f"tick {await store.get('last-tick')} recorded under token {lead.token}, cursor {await store.get('cursor')}")
try:
    await store.put(lead, "last-tick", 0)
except aioelect.LeadershipLost:
    print(f"a write under released token {lead.token} was refused; tick {await store.get('last-tick')}", flush=True)
await elector.aclose()
"""
    return _ASYNC_MAIN.format(body=_indent(setup + block + "\n" + after))


def _fenced_ticks(block: str, ctx: dict[str, str]) -> str:
    """``elector`` from the environment (as for fenced state); the block's leadership runs the due ticks for 2.5 s;
    afterwards a second leadership finds them recorded and runs none of them again."""
    setup = """\
if "AIOELECT_POSTGRES_DSN" in os.environ:
    os.environ["AIOELECT_SCHEMA"] = "public"  # fenced state checks the token row of the leaders table
elector = aioelect.from_env()
"""
    after = """\
last = await digest.last(elector)
async with aioelect.leadership(elector) as again:
    print(f"recorded up to tick {last}; a new leadership ran {await digest.run_due(again, send_digest)}", flush=True)
await elector.aclose()
"""
    # The block runs the ticks for as long as it leads: 2.5 s here.
    block = block.replace(
        "    await digest.run(lead, send_digest)",
        "    with anyio.move_on_after(2.5):\n        await digest.run(lead, send_digest)",
    )
    return _ASYNC_MAIN.format(body=_indent(setup + block + "\n" + after))


def _fenced_transaction(block: str, ctx: dict[str, str]) -> str:
    """``conn`` an asyncpg connection to the application's PostgreSQL (``APP_DATABASE``) with the page's fence table
    and a queued job; afterwards the job is dispatched and the fence row holds the leader's token."""
    setup = """\
import random

import asyncpg

conn = await asyncpg.connect(os.environ["APP_DATABASE"])
for ddl in (
    "CREATE TABLE IF NOT EXISTS aioelect_fence (name text PRIMARY KEY, token bigint NOT NULL)",
    "CREATE TABLE IF NOT EXISTS jobs (id bigint PRIMARY KEY, state text NOT NULL)",
):
    try:
        await conn.execute(ddl)
    except (asyncpg.UniqueViolationError, asyncpg.DuplicateTableError):
        pass  # created by a program running beside this one
job_id = random.randrange(1, 2**62)
await conn.execute("INSERT INTO jobs (id, state) VALUES ($1, 'queued')", job_id)
elector = aioelect.from_env()
"""
    after = """\
state = await conn.fetchval("SELECT state FROM jobs WHERE id = $1", job_id)
fence = await conn.fetchval("SELECT token FROM aioelect_fence WHERE name = $1", elector.name)
print(f"job {job_id}: {state}; fence row {fence}, token {lead.token}", flush=True)
await elector.aclose()
await conn.close()
"""
    return _ASYNC_MAIN.format(body=_indent(setup + block + "\n" + after))


def _as_printed(block: str, ctx: dict[str, str]) -> str:
    """The block is a whole program: it runs as printed."""
    return block + "\n"


def _sharded_scheduler(block: str, ctx: dict[str, str]) -> str:
    """``stop_requested`` defined, as the page says: stopping is requested once every job ran here (the harness
    makes each job due at once, rather than in a minute, once this instance owns its id, and records each run of
    the page's ``sync``)."""
    setup = """\
global scheduler, shards
from datetime import datetime, timezone

import billing_sync

synced: set[str] = set()
shown = billing_sync.sync


async def recorded(tenant: str, fencing_token: int | None) -> None:  # the harness's: the page's sync, recorded
    await shown(tenant, fencing_token)
    synced.add(tenant)


billing_sync.sync = recorded


class StopRequested:  # the harness's: set once each job has run on this instance
    async def wait(self) -> None:
        with anyio.fail_after(30):
            while synced != set(billing_sync.TENANTS):
                for job in scheduler.get_jobs():
                    if job.id in shards.owned and job.args[0] not in synced:
                        job.modify(next_run_time=datetime.now(timezone.utc))
                await anyio.sleep(0.1)


stop_requested = StopRequested()
"""
    return _ASYNC_MAIN.format(body=_indent(setup + block))


def _prometheus(block: str, ctx: dict[str, str]) -> str:
    """``elector`` defined; the page is read while it leads (on a free port rather than 9464)."""
    block = block.replace("9464", ctx["port"])
    after = f"""\
async with aioelect.leadership(elector):
    import urllib.request

    url = "http://127.0.0.1:{ctx["port"]}/metrics"
    page = await anyio.to_thread.run_sync(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    for line in page.splitlines():
        if line.startswith("aioelect_is_leader{{"):
            print(line, flush=True)
server.close()
"""
    body = "async with aioelect.from_env() as elector:\n" + _indent(block + "\n" + after)
    return _ASYNC_MAIN.format(body=_indent(body))


def _tls(block: str, ctx: dict[str, str]) -> str:
    """A certificate and key of the test's where the block names /etc/aioelect/...: the constructor checks them
    (they exist, parse, the key matches its certificate), and the password stays out of the elector's repr. The
    server is the test's, which speaks no TLS: the elector refuses it, as the page says, rather than go on in
    plaintext."""
    for name, path in ctx.items():
        block = block.replace(f"/etc/aioelect/{name}", path)
    after = """
assert os.environ["AIOELECT_PASSWORD"] not in repr(elector)
print(f"{type(elector).__name__} {elector.name} built, its TLS files checked", flush=True)


async def campaign() -> None:
    try:
        await elector.acquire(timeout=30)
    except aioelect.ElectionError as exc:
        assert os.environ["AIOELECT_PASSWORD"] not in str(exc)
        print(f"refused: {exc}", flush=True)
    finally:
        await elector.aclose()


asyncio.run(campaign())
"""
    return "import asyncio\nimport os\n\nimport aioelect\n\n" + block + "\n" + after


def _shared_session(block: str, ctx: dict[str, str]) -> str:
    """``endpoints`` or ``dsn`` are the harness's server; in place of ``...`` both electors lead at once."""
    work = """\
async with aioelect.leadership(jobs) as first, aioelect.leadership(mail) as second:
    print(f"jobs leads with token {first.token}, mail with token {second.token}, on one session", flush=True)"""
    lines = [
        textwrap.indent(work, line[: len(line) - len(line.lstrip())]) if line.strip() == "..." else line
        for line in block.splitlines()
    ]
    setup = (
        'endpoints = os.environ["AIOELECT_ETCD_ENDPOINTS"]\n'
        if "endpoints" in block
        else 'dsn = os.environ["AIOELECT_POSTGRES_DSN"]\n'
    )
    return _ASYNC_MAIN.format(body=_indent(setup + "\n".join(lines)))


@dataclass(frozen=True)
class Harness:
    """How one fragment is run: the program around it, the backends, and what it must print."""

    program: Callable[[str, dict[str, str]], str]
    #: The backends it runs on (the cases of tests/test_docs.py).
    backends: tuple[str, ...]
    #: Regular expressions every one of which some output line must match.
    expect: tuple[str, ...]
    #: Whether the program ends by itself (exit 0); else it is stopped once it has shown everything.
    ends: bool = True
    #: Replacements of a server address the block prints literally (the printed text must still be there).
    replace: dict[str, str] = field(default_factory=dict)
    #: The lowest Python the block runs on, as the page says.
    python: tuple[int, int] = (3, 10)
    #: The election names the block prints: blocks that share one do not run at once on one server.
    elects: str = ""
    #: A module the block imports, as the page tells the reader to save it: (file name, the fragment it holds).
    beside: tuple[str, str] = ("", "")


HARNESSES: dict[str, Harness] = {
    "acquire-timeout": Harness(
        _acquire_timeout,
        ("file", "postgres"),
        tuple(rf"^way {way}: leading with token [1-9]\d*$" for way in (1, 2, 3)),
        python=(3, 11),
    ),
    "fencing-write": Harness(
        _fencing_write,
        ("file", "mysql"),
        (r"^job \d+: dispatched with fence (\d+), token \1$", r"^a write under token \d+ matched 0 rows$"),
    ),
    "fenced-store": Harness(
        _fenced_store,
        ("file", "mysql", "postgres"),
        (
            r"^tick ([1-9]\d*) recorded under token [1-9]\d*, cursor \{'offset': 0\}$",
            r"^a write under released token [1-9]\d* was refused; tick [1-9]\d*$",
        ),
    ),
    "fenced-ticks": Harness(
        _fenced_ticks,
        ("file", "mysql", "postgres"),
        (
            r"^tick (\d+) \(for ticks \d+\.\.\1\) under token [1-9]\d*$",
            r"^recorded up to tick \d+; a new leadership ran \[\]$",
        ),
    ),
    "fenced-transaction": Harness(
        _fenced_transaction,
        ("mysql", "postgres"),
        (r"^job \d+: dispatched; fence row (\d+), token \1$",),
    ),
    "shards-from-env": Harness(
        _as_printed,
        ("file", "postgres"),
        tuple(rf"^synced {name} with token [1-9]\d*$" for name in ("acme", "globex", "initech", "umbrella")),
        ends=False,
        elects="billing/sync",
    ),
    "shards-etcd-session": Harness(
        _as_printed,
        ("etcd",),
        tuple(rf"^synced {name} with token [1-9]\d*$" for name in ("acme", "globex", "initech", "umbrella")),
        ends=False,
        elects="billing/sync",
        beside=("billing_sync.py", "shards-from-env"),
    ),
    "shards-postgres-session": Harness(
        _as_printed,
        ("postgres",),
        tuple(rf"^synced {name} with token [1-9]\d*$" for name in ("acme", "globex", "initech", "umbrella")),
        ends=False,
        elects="billing/sync",
        beside=("billing_sync.py", "shards-from-env"),
    ),
    "sharded-scheduler": Harness(
        _sharded_scheduler,
        ("file", "postgres"),
        tuple(rf"^synced {name} with token [1-9]\d*$" for name in ("acme", "globex", "initech", "umbrella")),
        elects="billing/sync",
        beside=("billing_sync.py", "shards-from-env"),
    ),
    "prometheus": Harness(_prometheus, ("file", "postgres"), (r"^aioelect_is_leader\{.*\} 1\.0$",)),
    "etcd-tls": Harness(
        _tls,
        ("tls",),
        (r"^EtcdElector /jobs/report built, its TLS files checked$", r"^refused: .*does not speak TLS"),
        replace={"https://etcd-1:2379,https://etcd-2:2379,https://etcd-3:2379": "https://{etcd}"},
    ),
    "mysql-tls": Harness(
        _tls,
        ("tls",),
        (r"^MySQLElector report built, its TLS files checked$", r"^refused: .*does not offer TLS"),
        replace={"@db:3306/app": "@{mysql}"},
    ),
    "postgres-tls": Harness(
        _tls,
        ("tls",),
        (r"^PostgresElector report built, its TLS files checked$", r"^refused: .*does not support TLS"),
        replace={"@db:5432/app": "@{postgres}"},
    ),
    "etcd-session": Harness(
        _shared_session, ("etcd",), (r"^jobs leads with token [1-9]\d*, mail with token [1-9]\d*, on one session$",)
    ),
    "sql-session": Harness(
        _shared_session,
        ("postgres",),
        (r"^jobs leads with token [1-9]\d*, mail with token [1-9]\d*, on one session$",),
    ),
}
