"""The documentation stays true: its code runs, its site builds, the README stays a start.

Every ```python block of README.md and docs/*.md stands right under a
marker that says how it is run, so that no block goes unrun:

* ``<!-- docs-test: runs -->``: a program that ends; it must exit 0, and a
  block that prints a fencing token must print a real one.
* ``<!-- docs-test: leader-loop -->``: a leader loop that never ends. It must
  lead and show a fencing token; when its lock is taken away from outside it
  must report the loss, campaign again and lead with a larger token.
* ``<!-- docs-test: pytest -->``: a test module, run by tests/test_testing.py.
* ``<!-- docs-test: fragment NAME -->``: lines around names the page
  introduces in prose (an ``elector``, a database ``db``): the harness NAME
  of tests/docs_fragments.py defines those names, runs the block as printed
  on a real backend and checks what it did.

The recipe pages (docs/recipes/) show only whole files of examples/recipes/,
copied inline under ``<!-- docs-test: copy of FILE -->`` and checked identical
to the file, which tests/test_recipes.py starts as users do.

Each block runs as its own Python process, configured only through the
environment as the docs tell users to (``AIOELECT_FILE``,
``AIOELECT_MYSQL_DSN`` or ``AIOELECT_POSTGRES_DSN``, and ``AIOELECT_NAME``):
on a lock file in a private directory, and on the real MariaDB and
PostgreSQL servers of the test harness.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import pytest

from .docs_fragments import HARNESSES

if TYPE_CHECKING:
    from aioelect.backends.sql._session_lock import SessionLockBackend
    from aioelect.core._config import LockTiming

ROOT = Path(__file__).resolve().parent.parent
#: Every page with code blocks; the recipe pages include files of examples/recipes/ that tests/test_recipes.py runs.
DOCUMENTS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
MARKER = re.compile(r"<!-- docs-test: ([a-z-]+)(?: ([a-z0-9-]+))? -->\n```python\n(.*?)\n```", re.S)
KINDS = ("runs", "leader-loop", "pytest", "fragment")
#: The kinds test_block_runs starts as programs, on every backend.
PROGRAMS = ("runs", "leader-loop")
#: How long a block may take to show what it must (the leader loop checks every second).
WAIT = 30.0
TOKEN = re.compile(r"token (\d+|None)")


def python_blocks(document: str) -> list[tuple[str, str]]:
    """(kind, source) of each marked ```python block; fails on a block without a marker."""
    text = (ROOT / document).read_text()
    total = len(re.findall(r"^```python\n", text, re.M))
    found = MARKER.findall(text)
    assert len(found) == total, (
        f"{document}: {total - len(found)} ```python block(s) without a <!-- docs-test: KIND --> marker right above"
    )
    for kind, harness, _ in found:
        assert kind in KINDS, f"{document}: unknown docs-test kind {kind!r} (known: {', '.join(KINDS)})"
        assert bool(harness) == (kind == "fragment"), f"{document}: only a fragment names its harness: {kind} {harness}"
    return [(kind, source + "\n") for kind, _, source in found]


def fragments(document: str) -> list[tuple[str, str]]:
    """(harness name, source) of each fragment of ``document``."""
    return [(harness, source) for kind, harness, source in MARKER.findall((ROOT / document).read_text()) if harness]


def all_blocks() -> list[tuple[str, int, str, str]]:
    return [
        (document, index, kind, source)
        for document in DOCUMENTS
        for index, (kind, source) in enumerate(python_blocks(document))
    ]


BLOCKS = [block for block in all_blocks() if block[2] in PROGRAMS]
BLOCK_IDS = [f"{document}#{index}-{kind}" for document, index, kind, _ in BLOCKS]


class Program:
    """A docs block running as its own process; its output lines are read by a thread."""

    def __init__(self, source: str, env: dict[str, str], cwd: Path, argv: list[str] | None = None) -> None:
        if argv is None:
            script = cwd / f"block_{uuid.uuid4().hex[:8]}.py"
            script.write_text(source)
            argv = [sys.executable, "-u", str(script)]
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=cwd,
            start_new_session=True,
            # As in a terminal: Ctrl-C raises KeyboardInterrupt even where the test runner was started with
            # SIGINT ignored (a background job of a script, as CI may be), which a child would inherit.
            preexec_fn=_default_sigint,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def expect(self, pattern: str, timeout: float = WAIT) -> re.Match[str]:
        """The first new output line that matches ``pattern``, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} within {timeout} s; output:\n" + self.text())
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(
                    f"the block exited ({self.proc.wait()}) before printing {pattern!r}; output:\n" + self.text()
                )
            self.output.append(line)
            found = re.search(pattern, line)
            if found:
                return found

    def lines_now(self) -> list[str]:
        """The output lines printed since the last read, without waiting."""
        new: list[str] = []
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                break
            if line is None:
                self._lines.put(None)  # the end stays visible to later reads
                break
            new.append(line)
        self.output.extend(new)
        return new

    def text(self) -> str:
        return "\n".join(self.output)

    def wait(self, timeout: float = WAIT) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return code
            if line is not None:
                self.output.append(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)


@pytest.fixture
def programs() -> Iterator[list[Program]]:
    """Every block process a test starts is killed and reaped afterwards."""
    started: list[Program] = []
    try:
        yield started
    finally:
        for program in started:
            program.stop()


def _default_sigint() -> None:  # pragma: no cover - runs in the forked child
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def base_env() -> dict[str, str]:
    """The test's environment without any AIOELECT_* setting, so that only what a case sets chooses the backend."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIOELECT_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def file_case(tmp_path: Path) -> tuple[dict[str, str], Callable[[], None]]:
    """The lock file backend in a directory of our own; the lock is taken away by deleting the lock file."""
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    lock = directory / "leader.lock"
    env = {**base_env(), "AIOELECT_FILE": str(lock), "AIOELECT_NAME": "docs/quickstart"}

    def take_away() -> None:
        lock.unlink()

    return env, take_away


def mysql_case(dsn: str) -> tuple[dict[str, str], Callable[[], None]]:
    """The harness's MariaDB; the lock is taken away by KILLing the connection that holds it."""
    import pymysql

    name = f"docs/{uuid.uuid4().hex[:12]}"
    env = {**base_env(), "AIOELECT_MYSQL_DSN": dsn, "AIOELECT_NAME": name}
    parts = urlsplit(dsn)

    def take_away() -> None:
        link = pymysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            connect_timeout=5,
        )
        try:
            with link.cursor() as cursor:
                cursor.execute("SELECT IS_USED_LOCK(%s)", (name,))
                (holder,) = cursor.fetchone()
                assert holder is not None, "the leader loop holds no lock"
                cursor.execute(f"KILL {int(holder)}")
        finally:
            link.close()

    return env, take_away


def postgres_case(dsn: str) -> tuple[dict[str, str], Callable[[], None]]:
    """The harness's PostgreSQL; the lock is taken away by ending the session that holds it."""
    import asyncio

    import asyncpg

    from aioelect.backends.sql.postgres import advisory_key, lock_ids

    name = f"docs/{uuid.uuid4().hex[:12]}"
    # schema: the leaders table that fenced state and handover notes live beside, as the pages tell users to.
    env = {**base_env(), "AIOELECT_POSTGRES_DSN": dsn, "AIOELECT_NAME": name, "AIOELECT_SCHEMA": "public"}
    classid, objid = lock_ids(advisory_key(name))

    async def terminate() -> None:
        link = await asyncpg.connect(dsn, timeout=5)
        try:
            ended = await link.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                "AND classid = $1 AND objid = $2 AND objsubid = 1 AND granted",
                classid,
                objid,
                timeout=5,
            )
            assert ended, "the leader loop holds no lock"
        finally:
            await link.close(timeout=5)

    def take_away() -> None:
        asyncio.run(terminate())

    return env, take_away


@pytest.fixture(params=["file", "mysql", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[dict[str, str], Callable[[], None]]:
    if request.param == "file":
        return file_case(tmp_path)
    if request.param == "mysql":
        return mysql_case(request.getfixturevalue("mysql_dsn"))
    return postgres_case(request.getfixturevalue("postgres_dsn"))


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("document", "index", "kind", "source"), BLOCKS, ids=BLOCK_IDS)
def test_block_runs(
    document: str,
    index: int,
    kind: str,
    source: str,
    backend: tuple[dict[str, str], Callable[[], None]],
    programs: list[Program],
    tmp_path: Path,
) -> None:
    env, take_away = backend
    program = Program(source, env, tmp_path)
    programs.append(program)
    if kind == "runs":
        code = program.wait()
        assert code == 0, f"{document} block {index} exited {code}:\n{program.text()}"
        if "token" in source:  # a block that shows its token shows a real one
            tokens = TOKEN.findall(program.text())
            assert tokens and "None" not in tokens, f"{document} block {index} shows no token:\n{program.text()}"
        return
    first = program.expect(TOKEN.pattern)
    assert first.group(1) != "None", f"{document}: the leader loop shows no fencing token:\n{program.text()}"
    program.expect(TOKEN.pattern)  # it goes on leading
    take_away()
    program.expect(r"lost leadership: \S")
    again = program.expect(TOKEN.pattern)
    assert again.group(1) != "None" and int(again.group(1)) > int(first.group(1)), (
        f"{document}: after the loss the loop must lead again with a larger token:\n{program.text()}"
    )
    assert program.proc.poll() is None, "the leader loop must keep running"


def test_every_fragment_has_its_harness_and_pytest_blocks_are_run() -> None:
    """Each fragment names a harness of tests/docs_fragments.py, each harness runs one fragment; a pytest block is
    tests/test_testing.py's."""
    named = [name for document in DOCUMENTS for name, _ in fragments(document)]
    assert sorted(named) == sorted(HARNESSES), f"fragments {sorted(named)}, harnesses {sorted(HARNESSES)}"
    for document, _, kind, _ in all_blocks():
        if kind == "pytest":
            text = (ROOT / document).read_text()
            assert "<!-- test: example run by tests/test_testing.py -->\n<!-- docs-test: pytest -->" in text


#: Each fragment with each backend its harness runs it on.
FRAGMENT_CASES = [
    (document, name, source, where)
    for document in DOCUMENTS
    for name, source in fragments(document)
    for where in HARNESSES[name].backends
]


def tls_files(directory: Path) -> dict[str, str]:
    """A certificate and its key (EC, made in milliseconds), under each name the security page gives a file of
    /etc/aioelect/: every constructor checks that they exist, parse, and that the key matches its certificate."""
    openssl = shutil.which("openssl")
    assert openssl is not None, "openssl is needed for the TLS fragments"
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", "/CN=aioelect-docs", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return {
        f"{prefix}-{name}": str(path)
        for prefix in ("etcd", "db", "pg")
        for name, path in (("ca.pem", cert), ("client.pem", cert), ("client-key.pem", key))
    }


def fragment_case(where: str, request: pytest.FixtureRequest, tmp_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The environment a fragment's program runs in, and what its harness puts in place of the page's addresses."""
    from .harness import free_port

    if where == "file":
        return file_case(tmp_path)[0], {"port": str(free_port())}
    if where == "mysql":
        return mysql_case(request.getfixturevalue("mysql_dsn"))[0], {}
    if where == "postgres":
        # Followers and observers poll: every 0.2 s rather than 2, through the variable the docs name.
        env = {**postgres_case(request.getfixturevalue("postgres_dsn"))[0], "AIOELECT_POLL_INTERVAL": "0.2"}
        return env, {"port": str(free_port())}
    if where == "etcd":
        endpoints = ",".join(request.getfixturevalue("etcd_endpoints"))
        return {**base_env(), "AIOELECT_ETCD_ENDPOINTS": endpoints}, {}
    assert where == "tls"
    return {**base_env(), "AIOELECT_PASSWORD": f"pw-{uuid.uuid4().hex}"}, tls_files(tmp_path)


def servers(request: pytest.FixtureRequest) -> dict[str, str]:
    """Where the test servers are, for the addresses harnesses put in place of the page's: ``host:port`` of etcd,
    ``host:port/database`` of MariaDB and PostgreSQL."""
    found = {"etcd": request.getfixturevalue("etcd_endpoints")[0]}
    for kind, fixture in (("mysql", "mysql_dsn"), ("postgres", "postgres_dsn")):
        parts = urlsplit(request.getfixturevalue(fixture))
        found[kind] = f"{parts.hostname}:{parts.port}{parts.path}"
    return found


@pytest.mark.timeout(180)
def test_every_fragment_runs_with_the_names_of_its_page(
    request: pytest.FixtureRequest, programs: list[Program], tmp_path: Path
) -> None:
    """Each fragment as printed, in the program its harness builds, on real backends: it shows what its page says.

    The programs run at once (each waits on its backend more than it computes), but for blocks that elect under
    the same names on the same server, which run in successive waves; each program is checked in turn.
    """
    waves: list[list[tuple[int, str, str, str, str]]] = []
    for index, (document, name, source, where) in enumerate(FRAGMENT_CASES):
        harness = HARNESSES[name]
        if sys.version_info < harness.python:  # the page names the version it needs
            continue
        elects = (where, harness.elects) if harness.elects and where not in ("file", "tls") else None
        wave = next((w for w in waves if elects is None or elects not in {elected(case) for case in w}), None)
        if wave is None:
            wave = []
            waves.append(wave)
        wave.append((index, document, name, source, where))
    for wave in waves:
        run_fragments(wave, request, programs, tmp_path)


def elected(case: tuple[int, str, str, str, str]) -> tuple[str, str]:
    """The server and the election names of a case."""
    _, _, name, _, where = case
    return where, HARNESSES[name].elects


def run_fragments(
    cases: list[tuple[int, str, str, str, str]], request: pytest.FixtureRequest, programs: list[Program], tmp_path: Path
) -> None:
    """Start every case at once, then check each."""
    started: list[tuple[str, str, str, Program]] = []
    for index, document, name, source, where in cases:
        harness = HARNESSES[name]
        directory = tmp_path / f"{index}-{name}-{where}"
        directory.mkdir()
        env, context = fragment_case(where, request, directory)
        if name == "fencing-write":  # the application's database the block writes to
            env["APP_DATABASE"] = request.getfixturevalue("mysql_dsn")
        if name == "fenced-transaction":
            env["APP_DATABASE"] = request.getfixturevalue("postgres_dsn")
        module, holder = harness.beside
        if module:  # saved beside it, as the page tells the reader
            (directory / module).write_text(dict(fragments(document))[holder] + "\n")
        for printed, used in harness.replace.items():
            assert printed in source, f"{document}: the {name} block no longer names {printed}"
            source = source.replace(printed, used.format(**servers(request)))
        program = Program(harness.program(source, context), env, directory)
        programs.append(program)
        started.append((document, name, where, program))
    failures: list[str] = []
    for document, name, where, program in started:
        harness = HARNESSES[name]
        missing = list(harness.expect)
        try:
            if harness.ends:
                code = program.wait(timeout=60)
                assert code == 0, f"exited {code}"
                missing = [p for p in missing if not any(re.search(p, line) for line in program.output)]
            else:
                while missing:
                    line = program.expect("", timeout=WAIT).string
                    missing = [p for p in missing if not re.search(p, line)]
                assert program.proc.poll() is None, "it must keep running"
            assert not missing, f"it showed none of {missing}"
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            failures.append(f"{document}: the {name} block on {where}: {exc}\n{program.text()}")
        program.stop()  # its names are free for the next wave
    assert not failures, "\n\n".join(failures)


def test_every_document_has_its_blocks() -> None:
    kinds = {document: [kind for kind, _ in python_blocks(document)] for document in DOCUMENTS}
    assert kinds["README.md"] == ["leader-loop"], "the README's example is one leader loop"
    assert "leader-loop" in kinds["docs/quickstart.md"]


def test_the_readme_is_a_start() -> None:
    """A newcomer's five minutes: short, what is supported, install, one example, the backends, the commands, links."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300, "the README is a start: the manual lives in docs/"
    versions = re.findall(r'"Programming Language :: Python :: (3\.\d+)"', (ROOT / "pyproject.toml").read_text())
    assert versions, "pyproject names the supported Python versions"
    for version in versions:
        assert version in readme, f"the README does not name Python {version}"
    assert "asyncio only" in readme and "no synchronous API" in readme
    for section in ("## Install", "## Example", "## Backends", "## Two commands", "## Documentation"):
        assert section in readme
    for command in ("make demo", "make test"):
        assert command in readme
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (ROOT / target).is_file(), f"the README links to {target}, which does not exist"


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    """`make docs` in little: every page, link and docstring of the API reference renders without a warning."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("mkdocs is not installed (the docs extra)")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text().count('id="aioelect.Elector.acquire"') == 1


@pytest.mark.timeout(180)
def test_the_try_once_block_gives_way_to_a_leader(
    backend: tuple[dict[str, str], Callable[[], None]], programs: list[Program], tmp_path: Path
) -> None:
    """The quickstart's `leadership(elector, wait=False)` block while another instance leads: it skips the job."""
    env, _ = backend
    blocks = {source: kind for kind, source in python_blocks("docs/quickstart.md")}
    (try_once,) = [source for source in blocks if "wait=False" in source]
    (loop,) = [source for source, kind in blocks.items() if kind == "leader-loop"]
    leader = Program(loop, env, tmp_path)
    programs.append(leader)
    leader.expect(TOKEN.pattern)
    follower = Program(try_once, env, tmp_path)
    programs.append(follower)
    code = follower.wait()
    assert code == 0, follower.text()
    assert follower.output == ["another instance leads: not running the report"], follower.text()
    assert leader.proc.poll() is None, "the leader loop must keep running"


SHELL = re.compile(r"<!-- docs-test: shell -->\n```sh\n(.*?)\n```", re.S)


def shell_setup(document: str) -> str:
    """The ```sh block of ``document`` marked ``<!-- docs-test: shell -->``: its one-host setup."""
    (setup,) = SHELL.findall((ROOT / document).read_text())
    return str(setup)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("document", ["README.md", "docs/quickstart.md"])
def test_followed_literally_on_one_host_a_leader_and_a_follower(
    document: str, programs: list[Program], tmp_path: Path
) -> None:
    """The shell setup, then the leader loop twice: one leads, the other says it campaigns; then a handover."""
    home = tmp_path / "home"
    home.mkdir()
    (loop,) = [source for kind, source in python_blocks(document) if kind == "leader-loop"]
    script = tmp_path / "leader.py"
    script.write_text(loop)
    env = {**base_env(), "HOME": str(home), "PYTHON": sys.executable}
    command = f'set -e\n{shell_setup(document)}\nexec "$PYTHON" -u leader.py\n'
    first = Program("", env, tmp_path, ["bash", "-c", command])
    programs.append(first)
    first.expect(r"leading with token 1\b")
    second = Program("", env, tmp_path, ["bash", "-c", command])
    programs.append(second)
    second.expect(r"aioelect.*campaigning")
    time.sleep(1.5)
    assert not any("leading with token" in line for line in second.lines_now()), second.text()
    first.proc.send_signal(signal.SIGINT)  # Ctrl-C
    first.wait()
    second.expect(r"leading with token 2\b")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["redis", "etcd"])
def test_a_sigterm_to_the_leader_loop_hands_over_at_once_on_a_lease_backend(
    where: str, request: pytest.FixtureRequest, programs: list[Program], tmp_path: Path
) -> None:
    """``kill PID`` of the README's leader loop releases its leadership: the follower leads well inside the lease
    (10 s on Redis, 5 s on etcd, at the defaults) instead of after it, and the loop exits with 128 + SIGTERM."""
    if where == "redis":
        setting = {"AIOELECT_REDIS_URL": request.getfixturevalue("redis_url")}
    else:
        setting = {"AIOELECT_ETCD_ENDPOINTS": ",".join(request.getfixturevalue("etcd_endpoints"))}
    env = {**base_env(), **setting, "AIOELECT_NAME": f"docs/sigterm-{uuid.uuid4().hex[:8]}"}
    (loop,) = [source for kind, source in python_blocks("README.md") if kind == "leader-loop"]
    first = Program(loop, env, tmp_path)
    programs.append(first)
    token = int(first.expect(TOKEN.pattern).group(1))
    second = Program(loop, env, tmp_path)
    programs.append(second)
    second.expect(r"aioelect.*campaigning")
    stopped = time.monotonic()
    first.proc.send_signal(signal.SIGTERM)  # what systemd and Kubernetes send
    assert first.wait() == 128 + signal.SIGTERM, first.text()
    assert "Traceback" not in first.text() and "released" in first.text(), first.text()
    taken = second.expect(TOKEN.pattern)
    gap = time.monotonic() - stopped
    assert int(taken.group(1)) > token
    assert gap < 4.0, f"the follower led {gap:.1f} s after the SIGTERM: the lease was left to expire"


def test_recipe_pages_show_only_files_the_recipe_tests_run() -> None:
    """Each ```python block of a recipe page is a copy, inline so that the repository page shows it, of the file of
    examples/recipes/ that its marker names and tests/test_recipes.py starts: identical, so the two cannot drift."""
    from tests.test_recipes import RECIPE_FILES

    copied: list[str] = []
    for page in sorted((ROOT / "docs" / "recipes").glob("*.md")):
        text = page.read_text()
        assert "--8<--" not in text, f"{page.name}: an include shows no code on the repository page; copy the file"
        blocks = re.findall(r"^```python\n", text, re.M)
        found = re.findall(r"^<!-- docs-test: copy of examples/recipes/([\w/]+\.py) -->\n```python\n(.*?)\n```$", text,
                           re.S | re.M)  # fmt: skip
        assert len(found) == len(blocks), f"{page.name}: a ```python block without <!-- docs-test: copy of FILE -->"
        for name, block in found:
            source = (ROOT / "examples" / "recipes" / name).read_text()
            assert block + "\n" == source, f"{page.name}: the block differs from examples/recipes/{name}; copy it again"
            copied.append(name)
    assert sorted(copied) == sorted(RECIPE_FILES), copied


def test_the_api_page_reads_on_the_repository_page() -> None:
    """docs/api.md names every public name with a line of prose, for readers who see its Markdown, not the site."""
    import aioelect

    text = (ROOT / "docs" / "api.md").read_text()
    prose = "\n".join(line for line in text.splitlines() if not line.startswith(("::: ", "    ")))
    for name in aioelect.__all__:
        assert re.search(rf"^\| `{name}(\(\))?` \| \S", prose, re.M), f"docs/api.md: no summary row for {name}"


# --- the server-side bounds table of docs/guarantees.md -------------------------------------

#: What aioelect does with each bound, by the name the backends' server_bounds() give it.
BOUND_ROLE = {
    "wait_timeout": "sets it to `lease`",
    "net_read_timeout": "raises it to at least `lease`",
    "net_write_timeout": "raises it to at least `lease`",
    "tcp_keepalive_time + tcp_keepalive_interval * tcp_keepalive_probes": "reads it (MariaDB; global only)",
    "idle_session_timeout": "sets it to `lease` (PostgreSQL 14+)",
    "idle_in_transaction_session_timeout": "sets it to `lease`",
    "tcp_keepalives_idle + tcp_keepalives_interval * tcp_keepalives_count": (
        "sets idle to `lease`, interval to `lease`/10 (at least 1 s), count to 3"
    ),
    "tcp_user_timeout": "reads it",
}


def bounds_table() -> str:
    """The table, computed at the defaults from the functions the backends check every lock session with."""
    from aioelect.backends.sql import mysql, postgres
    from aioelect.core._config import LockTiming, release_bound

    lease = 10
    rows = ["| backend | bound | aioelect | at the defaults |", "| --- | --- | --- | --- |"]
    # The server's own defaults where aioelect only reads (or only raises) a setting.
    mysql_session = {"wait_timeout": lease, "net_read_timeout": max(30, lease), "net_write_timeout": max(60, lease)}
    idle, interval, count = postgres.keepalives(lease)
    postgres_session = {
        "idle_session_timeout": lease,
        "idle_in_transaction_session_timeout": lease,
        "tcp_keepalives_idle": idle,
        "tcp_keepalives_interval": interval,
        "tcp_keepalives_count": count,
        "tcp_user_timeout": 0,
    }
    for product, backend, bounds in (
        ("MySQL / MariaDB", mysql.MySQLBackend, mysql.server_bounds(mysql_session)),
        ("PostgreSQL", postgres.PostgresBackend, postgres.server_bounds(postgres_session)),
    ):
        dialect = backend.dialect
        timing = LockTiming.checked(
            dialect.timing,
            poll_interval=2,
            check_interval=1,
            check_timeout=2,
            connect_timeout=5,
            lease=lease,
            renew_deadline=None,
        )
        assert timing.server_problem(bounds, product=product) is None
        for setting, seconds in bounds.items():
            shown = "off" if seconds is None else f"{seconds:g} s"
            rows.append(f"| {product} | `{setting}` | {BOUND_ROLE[setting]} | {shown} |")
        earliest = release_bound(bounds)
        assert earliest is not None
        margin = earliest[1] - timing.renew_deadline
        assert margin == timing.margin  # the margin run --grace uses
        rows.append(
            f"| {product} | earliest bound, and the safety margin | | {earliest[1]:g} s (`{earliest[0]}`); "
            f"margin **{margin:g} s** |"
        )
    rows += etcd_bounds_rows()
    rows += redis_bounds_rows()
    return "\n".join(rows)


def redis_bounds_rows() -> list[str]:
    """Redis's rows, at its defaults, from the settings and the checks every campaign try runs on ``CONFIG GET``."""
    from aioelect.backends.redis import RedisBackend
    from aioelect.backends.redis._bounds import config_problem, least_timeout, server_bounds
    from aioelect.core._config import release_bound

    backend = RedisBackend("redis://127.0.0.1:6379/0", name="docs")
    timing = backend.timing
    bounds = server_bounds(timing)
    # The server's defaults pass; each setting is refused where the docs say.
    defaults = {"timeout": "0", "tcp-keepalive": "300", "maxmemory": "0", "maxmemory-policy": "noeviction"}
    assert config_problem(defaults, timing, server="s") is None
    least = least_timeout(timing)
    assert config_problem({**defaults, "timeout": f"{least:g}"}, timing, server="s") is None
    assert "(timeout)" in (config_problem({**defaults, "timeout": f"{least - 1:g}"}, timing, server="s") or "")
    evicting = {**defaults, "maxmemory": "1gb", "maxmemory-policy": "volatile-ttl"}
    assert "maxmemory-policy volatile-ttl" in (config_problem(evicting, timing, server="s") or "")
    assert config_problem({**defaults, "tcp-keepalive": "1"}, timing, server="s") is None
    earliest = release_bound(bounds)
    assert earliest is not None and earliest[1] == timing.lease
    margin = earliest[1] - timing.renew_deadline
    assert margin == backend.margin  # the margin run --grace uses
    return [
        f"| Redis | {earliest[0]} | sets it to `lease` at every grant and renew | {earliest[1]:g} s |",
        "| Redis | `maxmemory-policy` (with `maxmemory` set) | reads it; refuses any policy but `noeviction`: an"
        " evicted key passes the lock on before its expiry (`PermanentBackendError`) | `noeviction` |",
        "| Redis | `timeout` | reads it; refuses one below max(`check_interval`, `poll_interval`, `lease`) + 1 s,"
        " which closes a connection between two renews, or a waiting candidate's before the lock key can have"
        f" expired (`PermanentBackendError`) | off; refused below {least:g} s |",
        "| Redis | `tcp-keepalive` | reads it; not a bound: a connection the server closes releases nothing, the"
        f" key keeps its expiry | {defaults['tcp-keepalive']} s |",
        f"| Redis | earliest bound, and the safety margin | | {earliest[1]:g} s ({earliest[0]}); margin"
        f" **{margin:g} s** |",
    ]


def etcd_bounds_rows() -> list[str]:
    """etcd's rows, at its defaults, from the settings and the grant check every etcd session uses."""
    from aioelect.backends.etcd._options import EtcdSettings, grant_problem

    settings = EtcdSettings.parse("http://127.0.0.1:2379", {"name": "docs"})
    ttl, deadline = settings.ttl, settings.timing.renew_deadline
    assert grant_problem(ttl, ttl) is None and grant_problem(ttl, ttl + 1) is None  # etcd's minimum TTL: longer
    shorter = grant_problem(ttl, ttl - 1)
    assert shorter is not None and f"{ttl - 1}s lease for the {ttl}s asked" in shorter
    # The lease outlives the send of the last acknowledged keep-alive by ttl; the leader fences itself
    # renew_deadline after that send; keep-alives go out often enough to be retried before it.
    assert settings.keepalive_interval + settings.keepalive_timeout <= deadline < ttl
    margin = ttl - deadline
    assert margin == settings.margin  # the margin run --grace and the campaign log use
    keepalive = (
        "every `ttl`/3, `ttl`/12 while leading, each given up after min(`ttl`/3, `renew_deadline` \u2212 `ttl`/3)/2 "
        "(at least 0.1 s) and retried"
    )
    return [
        f"| etcd | the lease's TTL | asks for `ttl`; refuses a shorter grant (`ElectionError`), revoking it "
        f"| {ttl} s |",
        f"| etcd | (a renewal, not a bound) keep-alive | {keepalive} | every {settings.keepalive_interval:.3g} s "
        f"({settings.lead_interval:.3g} s leading), within {settings.keepalive_timeout:.3g} s |",
        f"| etcd | (where the leader fences itself) `renew_deadline` | 2/3 \u00d7 `ttl` unless given; shorter than "
        f"`ttl`, longer than `ttl`/3 | {deadline:.3g} s |",
        f"| etcd | earliest bound, and the safety margin | | {ttl} s (the lease's TTL); margin **{margin:.3g} s** |",
    ]


def test_the_server_bounds_table_is_computed_from_the_backends() -> None:
    text = (ROOT / "docs" / "guarantees.md").read_text()
    found = re.search(r"<!-- server-bounds:start -->\n(.*?)\n<!-- server-bounds:end -->", text, re.S)
    assert found is not None, "docs/guarantees.md lost its server-bounds markers"
    expected = bounds_table()
    assert found.group(1) == expected, f"docs/guarantees.md's table must read:\n{expected}"


def mysql_backend() -> SessionLockBackend[Any]:
    """A MySQL backend with every timing option at its default (nothing connects)."""
    from aioelect import MySQLElector
    from aioelect.backends.sql._session_lock import SessionLockBackend

    backend = MySQLElector("mysql://root@127.0.0.1:1/db", name="docs")._backend
    assert isinstance(backend, SessionLockBackend)
    return backend


def default_timing() -> LockTiming:
    """The session-lock timing at the defaults, as an elector given no timing option has it."""
    return mysql_backend().timing


def test_the_documented_margins_are_the_computed_ones() -> None:
    """The 3 s (and its half, the default --grace) that concepts.md and operations.md state at the defaults."""
    from aioelect.backends.redis import RedisBackend

    margin = default_timing().margin
    assert RedisBackend("redis://127.0.0.1:6379/0", name="docs").margin == margin
    concepts = " ".join((ROOT / "docs" / "concepts.md").read_text().split())
    operations = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    assert f"`lease \u2212 renew_deadline`: {margin:g} s on MySQL, PostgreSQL and Redis" in concepts
    assert f"lease less renew deadline: {margin:g} s on MySQL, PostgreSQL and Redis" in operations
    assert f"half the margin ({margin / 2:g} s on MySQL, PostgreSQL and Redis" in operations


def test_the_documented_bound_for_a_deposed_leader_is_the_one_the_code_uses() -> None:
    """check_interval + 2 * check_timeout (LockTiming.deposed_within), in the docs, the campaign log and the soak."""
    from aioelect.core._config import confirmation_gap
    from soak.timing import _CHECK_INTERVAL, _CHECK_TIMEOUT, OVERLAP_SLACK, TIMINGS

    defaults = default_timing()
    bound = defaults.deposed_within
    assert bound == confirmation_gap(defaults.check_interval, defaults.check_timeout) == 1 + 2 * 2
    pages = {page.name: " ".join(page.read_text().split()) for page in (ROOT / "docs").glob("*.md")}
    for name, text in pages.items():
        assert "check_interval + check_timeout" not in text, f"docs/{name} states a bound the code does not keep"
    assert f"`check_interval + 2 \u00d7 check_timeout` ({bound:g} s at the defaults)" in pages["guarantees.md"]
    assert f"stops within `check_interval + 2 \u00d7 check_timeout` ({bound:g} s)" in pages["backends.md"]
    assert f"a deposed leader stops within {bound:g}s" in mysql_backend().describe_timing()
    margin = TIMINGS["mariadb"][1].margin
    assert margin == confirmation_gap(_CHECK_INTERVAL, _CHECK_TIMEOUT) + OVERLAP_SLACK
    assert f"plus 0.5 s of scheduling: {margin:g} s and" in pages["soak.md"]


def _state_diagrams() -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location("state_diagrams", ROOT / "scripts" / "state_diagrams.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_state_diagrams_are_drawn_from_the_transition_tables() -> None:
    """Each state diagram in the docs is what its table draws now (`python scripts/state_diagrams.py` redraws)."""
    diagrams = _state_diagrams()
    for name in diagrams.DIAGRAMS:  # type: ignore[attr-defined]
        assert diagrams.committed(name) == diagrams.drawn(name), (  # type: ignore[attr-defined]
            f"the {name} state diagram differs from its transition table: run python scripts/state_diagrams.py"
        )


def test_the_mysql_table_the_concepts_page_shows_is_the_one_the_backend_creates(mariadb: Any, mysql_dsn: str) -> None:
    """The ```sql block of docs/concepts.md, run as printed, makes the table the backend creates, and it elects."""
    import anyio

    from aioelect import MySQLElector

    text = (ROOT / "docs" / "concepts.md").read_text()
    (ddl,) = re.findall(r"```sql\n(.*?)\n```", text, re.S)
    printed, created = f"docs_sql_{uuid.uuid4().hex[:8]}", f"docs_sql_{uuid.uuid4().hex[:8]}"

    def columns(database: str) -> list[tuple[Any, ...]]:
        return mariadb.query(f"SHOW COLUMNS FROM {database}.aioelect_leaders", database="")

    async def elect(database: str) -> int | None:
        dsn = urlsplit(mysql_dsn)._replace(path=f"/{database}").geturl()
        async with MySQLElector(dsn, name="docs-sql", fencing=True) as elector:
            lead = await elector.acquire(timeout=20)
            token = lead.token
            await lead.release()
            return token

    for database in (printed, created):
        mariadb.query(f"CREATE DATABASE {database}", database="")
    try:
        mariadb.query(ddl, database=printed)
        assert anyio.run(elect, printed) == 1
        assert anyio.run(elect, created) == 1
        assert columns(printed) == columns(created)
    finally:
        for database in (printed, created):
            mariadb.query(f"DROP DATABASE IF EXISTS {database}", database="")
