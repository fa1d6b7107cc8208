"""``--health-url`` on real servers: a URL served on loopback decides whether an instance campaigns (``run``) or
takes part (``shards``); a leader whose URL answers 503, or hangs past --health-timeout, hands over."""

from __future__ import annotations

import asyncio
import base64
import http.server
import secrets
import signal
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aioelect.cli._health_url import parse_health_url

from .test_cli import Lines, Spawner, Target, cli, target, wait_until
from .test_cli_handover import handover_options
from .test_cli_shards import running
from .test_cli_shards import start as start_shards

__all__ = ["target"]  # the fixture, shared with test_cli

pytestmark = pytest.mark.timeout(120)


class Probe:
    """An HTTP server on loopback whose paths answer the status the test sets (0: hang until closed)."""

    def __init__(self) -> None:
        self.status: dict[str, int] = {}
        self.authorizations: list[str | None] = []
        self.closing = threading.Event()
        probe = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                probe.authorizations.append(self.headers.get("Authorization"))
                status = probe.status.get(self.path, 404)
                if status == 0:
                    probe.closing.wait(60)
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()

    def url(self, path: str, userinfo: str = "") -> str:
        return f"http://{userinfo}127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def probe() -> Iterator[Probe]:
    served = Probe()
    try:
        yield served
    finally:
        served.close()


HEALTH = ["--health-interval", "0.2", "--health-timeout", "1", "--health-failures", "2", "--health-backoff", "30"]


def test_health_url_503_moves_cmd_to_a_healthy_instance(
    target: Target, spawner: Spawner, probe: Probe, tmp_path: Path
) -> None:
    """cand-b's URL answers 503: it does not campaign. Then cand-a's answers 503 and cand-b's 200: cand-a steps
    down and cand-b leads. The password in the URL is sent, as Basic authorization, and never logged."""
    lines = Lines(tmp_path / "ticks")
    backend = [*target.with_name(), *target.tuning, *handover_options(target)]
    password = secrets.token_hex(8)
    probe.status.update({"/a": 200, "/b": 503})
    procs = {
        ident: spawner.run_cmd(
            *backend,
            *HEALTH,
            "--health-url",
            probe.url(f"/{ident[-1]}", f"probe:{password}@"),
            "--identity",
            ident,
            out=lines.path,
            mode="graceful",
        )
        for ident in ("cand-a", "cand-b")
    }
    wait_until("cand-a to run the command", lambda: bool(lines.of("cand-a", "start")), 30)
    time.sleep(1.0)
    assert not lines.of("cand-b"), "cand-b's URL answers 503: it must not campaign"
    probe.status.update({"/a": 503, "/b": 200})
    began = time.monotonic()
    wait_until("cand-b to run the command", lambda: bool(lines.of("cand-b", "start")), 15)
    print(f"{target.kind}: leader on a 503 replaced in {time.monotonic() - began:.2f}s")
    assert lines.of("cand-a", f"signal-{int(signal.SIGTERM)}")
    for proc in procs.values():
        proc.send_signal(signal.SIGTERM)
        spawner.wait(proc)
    a, b = spawner.stderr(procs["cand-a"]), spawner.stderr(procs["cand-b"])
    assert "stepping down: unhealthy" in a and "answered 503" in a
    assert "not campaigning" in b and "answered 503" in b
    assert password not in a + b
    wanted = "Basic " + base64.b64encode(f"probe:{password}".encode()).decode()
    assert probe.authorizations and set(probe.authorizations) == {wanted}


def test_a_hanging_health_url_is_bounded_by_its_timeout(spawner: Spawner, probe: Probe, tmp_path: Path) -> None:
    """A leader whose URL stops answering steps down after --health-failures checks of --health-timeout each."""
    lines = Lines(tmp_path / "ticks")
    backend = ["--file", str(tmp_path / "lock"), "--name", "hang", "--poll-interval", "0.05"]
    probe.status["/a"] = 200
    health = ["--health-interval", "0.2", "--health-timeout", "0.5", "--health-failures", "2"]
    proc = spawner.run_cmd(
        *backend, *health, "--health-url", probe.url("/a"), "--identity", "cand-a", out=lines.path, mode="graceful"
    )
    wait_until("cand-a to run the command", lambda: bool(lines.of("cand-a", "start")), 30)
    probe.status["/a"] = 0
    began = time.monotonic()
    taken = wait_until(
        "cand-a to stop its command", lambda: bool(lines.of("cand-a", f"signal-{int(signal.SIGTERM)}")), 10
    )
    print(f"hanging URL: leader stepped down {taken:.2f}s after it stopped answering")
    # Two checks, 0.5 s each at most, 0.2 s apart, then the step-down: well within 3 s, even on a loaded machine.
    assert time.monotonic() - began < 3.0
    proc.send_signal(signal.SIGTERM)
    spawner.wait(proc)
    assert "did not answer within 0.5s" in spawner.stderr(proc)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://127.0.0.1/", "only http:// and https://"),
        ("http:///healthz", "names no host"),
        ("http://127.0.0.1:99999/", "not a URL"),
        ("http://127.0.0.1/a b", "no spaces"),
        ("https://user:hunter2@127.0.0.1:/x\r\n", "no spaces or control"),
        ("file://user:hunter2@/etc/passwd", "only http:// and https://"),
    ],
)
def test_a_bad_health_url_is_a_usage_error_that_shows_no_password(url: str, message: str, tmp_path: Path) -> None:
    for command in ("run", "shards"):
        names = ["--names", "a"] if command == "shards" else []
        done = cli(command, "--file", str(tmp_path / "lock"), "--name", "g", *names, "--health-url", url, "--", "true")
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and "hunter2" not in done.stderr


def test_shards_unhealthy_url_hands_every_name_over(spawner: Spawner, probe: Probe, tmp_path: Path) -> None:
    """C's URL answers 503: it never owns a name. A's turns 503: A's names go to B (A's CMDs stopped first), and
    once A's URL answers 200 again after its back-off, A takes its share back."""
    out = tmp_path / "cmds.log"
    group = f"health-{secrets.token_hex(3)}"
    backend = ["--file", str(tmp_path / "lock")]
    probe.status.update({"/A": 200, "/B": 200, "/C": 503})
    health = ["--health-interval", "0.2", "--health-timeout", "1", "--health-failures", "2", "--health-backoff", "2"]
    procs = {
        ident: start_shards(spawner, backend, group, ident, out, *health, "--health-url", probe.url(f"/{ident}"))
        for ident in ("A", "B", "C")
    }
    wait_until(
        "two CMDs on A and B", lambda: sorted(Counter(running(out).values()).items()) == [("A", 2), ("B", 2)], 30
    )
    probe.status["/A"] = 503
    began = time.monotonic()
    wait_until("B runs every CMD", lambda: running(out) == dict.fromkeys("abcd", "B"), 15)
    print(f"shards: an unhealthy instance's names moved in {time.monotonic() - began:.2f}s")
    probe.status["/A"] = 200
    wait_until(
        "A takes its share back", lambda: sorted(Counter(running(out).values()).items()) == [("A", 2), ("B", 2)], 30
    )
    for proc in procs.values():
        proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        assert spawner.wait(proc, 30) == 128 + signal.SIGTERM
    assert running(out) == {}
    assert "C" not in {e.split()[3] for e in out.read_text().splitlines()}
    assert "not taking part" in spawner.stderr(procs["C"]) and "answered 503" in spawner.stderr(procs["C"])
    assert "unhealthy" in spawner.stderr(procs["A"])


async def test_https_verifies_the_certificate(certs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server whose certificate the system does not trust fails the check; trusted (SSL_CERT_FILE), it passes."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.server_cert, certs.server_key)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    try:
        url = parse_health_url(f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/healthz")
        with pytest.raises(ssl.SSLCertVerificationError):
            await url.check()
        monkeypatch.setenv("SSL_CERT_FILE", certs.ca)
        assert await url.check() is True
    finally:
        server.close()
        await server.wait_closed()


def test_a_health_url_in_the_environment_is_used_and_kept_from_cmd(probe: Probe, tmp_path: Path) -> None:
    """``AIOELECT_HEALTH_URL`` (a password kept out of ``ps``) is the check as ``--health-url`` would be: a 503
    keeps the instance from campaigning; a 200 lets it lead, and CMD's environment does not hold the URL."""
    secret = secrets.token_hex(8)
    url = probe.url("/healthz", f"ops:{secret}@")
    lock = str(tmp_path / "lock")
    probe.status["/healthz"] = 503
    refused = cli("run", "--file", lock, "--name", "g", "--no-wait", *HEALTH, "--", "true", AIOELECT_HEALTH_URL=url)
    assert refused.returncode != 0 and secret not in refused.stderr, refused.stderr
    probe.status["/healthz"] = 200
    done = cli("run", "--file", lock, "--name", "g", *HEALTH, "--", "env", AIOELECT_HEALTH_URL=url)
    assert done.returncode == 0, done.stderr
    assert "AIOELECT_HEALTH_URL" not in done.stdout and secret not in done.stdout + done.stderr
    expected = "Basic " + base64.b64encode(f"ops:{secret}".encode()).decode()
    assert expected in probe.authorizations
