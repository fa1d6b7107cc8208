"""The probe and metrics server under a client that holds every slot it can and reopens each one at once.

A real ``aioelect run --health-port --metrics-port`` process; the attacker
is another process whose connections come from other loopback addresses
(127.0.0.2 to 127.0.0.5) than the probes (127.0.0.1), as another host's
would. Every wait is bounded; both processes are killed on any failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

import httpx

from aioelect._http import HEAD_TIMEOUT, REQUEST_TIMEOUT
from aioelect.integrations.health import HealthServer

from .test_integrations import ROOT, MakeMemory, free_port, probe, stop_process, wait_for, wait_for_probe

#: Holds ``per_port`` connections from each source address to each port, each having sent one byte of a
#: request; reopens a connection the moment the server closes or resets it. Prints its counts at the end.
ATTACKER = r"""
import selectors, socket, sys, time
ports = [int(p) for p in sys.argv[1].split(",")]
sources, per_port, duration = sys.argv[2].split(","), int(sys.argv[3]), float(sys.argv[4])
selector = selectors.DefaultSelector()
opened = dropped = failed = 0

def open_one(source, port):
    global opened, failed
    sock = socket.socket()
    sock.settimeout(1.0)
    try:
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
        sock.send(b"G")
    except OSError:
        failed += 1
        sock.close()
        return False
    sock.setblocking(False)
    selector.register(sock, selectors.EVENT_READ, (source, port))
    opened += 1
    return True

for source in sources:
    for port in ports:
        for _ in range(per_port):
            open_one(source, port)
print("holding", flush=True)
end = time.monotonic() + duration
while time.monotonic() < end:
    for key, _ in selector.select(0.05):
        selector.unregister(key.fileobj)
        key.fileobj.close()
        dropped += 1
        while time.monotonic() < end and not open_one(*key.data):
            time.sleep(0.01)
    held = len(selector.get_map())
    for source in sources:  # top up what could not be reopened at once
        for port in ports:
            if held < len(sources) * len(ports) * per_port:
                held += open_one(source, port)
print(f"opened {opened} dropped {dropped} failed {failed}", flush=True)
"""


async def probe_for(url: str, seconds: float) -> tuple[int, int, list[str]]:
    """Probe ``url`` from 127.0.0.1 every 0.1 s for ``seconds``: (probes, answered 200, what the others got)."""
    probes, ok, other = 0, 0, []
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.1")
    async with httpx.AsyncClient(timeout=2.0, transport=transport) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            probes += 1
            try:
                response = await client.get(url)
            except httpx.TransportError as exc:
                other.append(type(exc).__name__)
            else:
                if response.status_code == 200:
                    ok += 1
                else:
                    other.append(str(response.status_code))
            await asyncio.sleep(0.1)
    return probes, ok, other


async def test_one_client_holding_every_slot_it_can_does_not_fail_the_probes(tmp_path: Path) -> None:
    """Four attacking addresses, 32 one-byte connections each to each port, reopened the moment they are dropped:
    /healthz and /metrics from 127.0.0.1 still answer 200 (at least 90 % of the probes), and the leader leads on.

    Without a per-peer limit, a short head timeout and slots kept for new peers, every slot is the attacker's
    and nearly every probe is reset.
    """
    lock, port, metrics_port = tmp_path / "lock", free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOELECT_")}
    env["PYTHONPATH"] = str(ROOT)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aioelect", "run", "--file", str(lock), "--identity", "a", "--forever",
        "--health-port", str(port), "--metrics-port", str(metrics_port),
        "--", sys.executable, "-c", "import time; time.sleep(120)",
        env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    errors = asyncio.create_task(process.stderr.read())  # read all along: a full pipe would block the supervisor
    attacker: asyncio.subprocess.Process | None = None
    health, metrics = f"http://127.0.0.1:{port}/healthz", f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        await wait_for_probe(f"http://127.0.0.1:{port}/leader", 200, timeout=30)
        attacker = await asyncio.create_subprocess_exec(
            sys.executable, "-c", ATTACKER, f"{port},{metrics_port}", "127.0.0.2,127.0.0.3,127.0.0.4,127.0.0.5",
            "32", "12", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert attacker.stdout is not None
        assert await asyncio.wait_for(attacker.stdout.readline(), 30) == b"holding\n"
        await asyncio.sleep(1.0)  # every slot the attacker can take is taken
        (probes, ok, other), (metric_probes, metric_ok, metric_other) = await asyncio.gather(
            probe_for(health, 8.0), probe_for(metrics, 8.0)
        )
        assert attacker.returncode is None, "the attack ended before the probes did"
        print(f"under attack: /healthz {ok}/{probes} answered 200, /metrics {metric_ok}/{metric_probes}; "
              f"the others: {sorted(set(other + metric_other))}")  # fmt: skip
        assert ok >= 0.9 * probes and metric_ok >= 0.9 * metric_probes, (probes, ok, other, metric_other)
        counts, _ = await asyncio.wait_for(attacker.communicate(), 30)
        print("attacker:", counts.decode().strip())
        body = await wait_for_probe(f"http://127.0.0.1:{port}/leader", 200, timeout=10)
        assert body["identity"] == "a" and process.returncode is None
    finally:
        if attacker is not None and attacker.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                attacker.kill()
            await asyncio.wait_for(attacker.wait(), 10)
        await stop_process(process)
        stderr = (await asyncio.wait_for(errors, 10)).decode(errors="replace")
    assert "leadership lost" not in stderr and "Traceback" not in stderr, stderr[-3000:]


async def _connect_from(source: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), 5)


async def _was_reset(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed this connection unanswered (as it does to one it refuses)."""
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionResetError:
        return True


async def test_a_peer_holds_a_quarter_of_the_slots_and_the_last_quarter_waits_for_new_peers(
    memory_elector: MakeMemory,
) -> None:
    """8 slots: each address holds at most 2; once 6 are taken, only an address that holds none gets one more."""
    server = HealthServer(memory_elector("a"), max_connections=8)
    held: list[asyncio.StreamWriter] = []
    async with server:
        await server.start()
        http = server.http
        http.request_timeout = http.head_timeout = 60.0  # the idle connections stay for the whole test
        assert (http.max_per_peer, http.reserved) == (2, 2)
        refused = 0

        async def step(source: str, admitted: bool) -> None:
            nonlocal refused
            opened = http.open_connections + 1
            reader, writer = await _connect_from(source, server.port)
            held.append(writer)
            if admitted:
                await wait_for(lambda: http.open_connections == opened, what=f"a slot for {source}")
            else:
                refused += 1
                assert await _was_reset(reader), f"{source} got an answer instead of a reset"
                await wait_for(lambda: http.refused == refused, what=f"{source} refused")

        try:
            for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
                await step(source, True)
                await step(source, True)
            await step("127.0.0.2", False)  # at its share
            await step("127.0.0.5", True)  # 6 open: the reserved slots, for an address that holds none
            await step("127.0.0.5", False)  # it holds one now
            await step("127.0.0.6", True)
            await step("127.0.0.7", False)  # all 8 taken
            assert http.open_connections == 8 and http.refused == 3
        finally:
            for writer in held:
                writer.close()
        await wait_for(lambda: http.open_connections == 0, what="the closed connections to be dropped")
        assert (await probe(f"http://127.0.0.1:{server.port}/healthz"))[0] == 200


async def test_a_head_not_sent_within_the_head_timeout_is_answered_408_and_dropped(memory_elector: MakeMemory) -> None:
    """One byte of a request, then nothing: 408 after HEAD_TIMEOUT (2 s), well before the 5 s request timeout."""
    async with HealthServer(memory_elector("a")) as server:
        await server.start()
        reader, writer = await _connect_from("127.0.0.1", server.port)
        try:
            writer.write(b"G")
            started = time.monotonic()
            answer = await asyncio.wait_for(reader.read(), 10)
            took = time.monotonic() - started
        finally:
            writer.close()
        print(f"a one-byte head was dropped after {took:.2f}s")
        assert answer.startswith(b"HTTP/1.1 408 ") and HEAD_TIMEOUT - 0.1 <= took < REQUEST_TIMEOUT, (answer, took)
