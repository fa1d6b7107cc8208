"""What a server answers is input: replies are bounded and checked, and fencing tokens only go up.

A hostile endpoint here is a tiny RESP server on loopback that speaks
enough of the protocol for a campaign to reach its acquire script, then
answers it with what a compromised or broken server could send (a bulk
string of 256 MiB, an array of a million strings of 1 KiB, a reply of
the wrong shape). It is input to the client, not a stand-in for Redis:
the token checks run against a real ``redis-server``, its token counter
changed as an operator could change it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from aioelect import PermanentBackendError, RedisElector
from aioelect.backends.redis._replies import MAX_REPLY
from aioelect.backends.redis._scripts import ACQUIRE

from .backends import REDIS, unique_name
from .harness import RedisServer

ROOT = Path(__file__).resolve().parent.parent
ACQUIRE_SHA = hashlib.sha1(ACQUIRE.encode()).hexdigest()
#: What the hostile bulk string claims: far more than any reply of the election.
CLAIMED = 256 << 20

#: Writes the answer to the acquire script; returns once done (or once the client is gone).
Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]

CONFIG = {
    "appendonly": "yes",
    "appendfsync": "always",
    "timeout": "0",
    "tcp-keepalive": "300",
    "maxmemory": "0",
    "maxmemory-policy": "noeviction",
}


def _bulk(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return b"$%d\r\n%s\r\n" % (len(data), data)


class HostileRedis:
    """A loopback RESP endpoint: sane answers to the handshake and the checks, ``answer`` to the acquire script.

    ``sent`` counts the bytes of the hostile answers the client took before it closed the connection.
    """

    def __init__(self, answer: Answer, *, resp3: bool = False) -> None:
        self.answer = answer
        self.resp3 = resp3
        self.sent = 0
        self.commands: list[str] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/0"

    async def __aenter__(self) -> HostileRedis:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), 10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                args = await self._command(reader)
                if args is None:
                    return
                self.commands.append(args[0].upper())
                await self._reply(args, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _command(self, reader: asyncio.StreamReader) -> list[str] | None:
        head = await reader.readline()
        if not head:
            return None
        assert head.startswith(b"*"), head
        args = []
        for _ in range(int(head[1:])):
            size = int((await reader.readline())[1:])
            args.append((await reader.readexactly(size + 2))[:-2].decode())
        return args

    async def _reply(self, args: list[str], writer: asyncio.StreamWriter) -> None:
        command = args[0].upper()
        if (command, args[1:2]) in (("EVALSHA", [ACQUIRE_SHA]), ("EVAL", [ACQUIRE])):
            await self.answer(writer)
            return
        if command == "HELLO" and self.resp3:
            writer.write(b"%2\r\n" + _bulk("server") + _bulk("redis") + _bulk("proto") + b":3\r\n")
        elif command == "HELLO":  # the client falls back to RESP2
            writer.write(b"-ERR unknown command 'HELLO'\r\n")
        elif command in ("EVALSHA", "EVAL"):  # renew, release: ours
            writer.write(b":1\r\n")
        elif command == "INFO":
            info = "redis_version:7.4.0\r\naof_enabled:1\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n"
            writer.write(_bulk(info))
        elif command == "CONFIG":
            pairs = [x for name in args[2:] for x in (name, CONFIG[name])]
            writer.write(b"*%d\r\n" % len(pairs) + b"".join(_bulk(x) for x in pairs))
        elif command in ("SUBSCRIBE", "UNSUBSCRIBE"):
            kind, push = command.lower(), b">3\r\n" if self.resp3 else b"*3\r\n"
            for count, channel in enumerate(args[1:], 1):
                subscribed = b":%d\r\n" % (count if kind == "subscribe" else 0)
                writer.write(push + _bulk(kind) + _bulk(channel) + subscribed)
        elif command == "GET":
            writer.write(b"$-1\r\n")
        elif command == "PING":
            writer.write(b"+PONG\r\n")
        elif command == "ROLE":  # a master without replicas
            writer.write(b"*3\r\n" + _bulk("master") + b":0\r\n*0\r\n")
        elif command == "WAIT":
            writer.write(b":0\r\n")
        else:
            writer.write(b"+OK\r\n")
        await writer.drain()

    def counted(self, header: bytes, chunk: bytes, total: int) -> Answer:
        """An answer: ``header``, then ``chunk`` repeated up to ``total`` bytes, counted in :attr:`sent`."""

        async def answer(writer: asyncio.StreamWriter) -> None:
            writer.write(header)
            block = chunk * max(1, 65536 // len(chunk))
            while self.sent < total:
                writer.write(block)
                await writer.drain()
                self.sent += len(block)

        return answer


def fixed(data: bytes) -> Answer:
    async def answer(writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()

    return answer


@contextlib.asynccontextmanager
async def hostile(make: Callable[[HostileRedis], Answer], *, resp3: bool = False) -> AsyncIterator[HostileRedis]:
    """A :class:`HostileRedis` answering the acquire script with ``make(server)``."""
    server = HostileRedis(fixed(b""), resp3=resp3)
    server.answer = make(server)
    async with server:
        yield server


HUGE: dict[str, Callable[[HostileRedis], Answer]] = {
    "a bulk string of 256 MiB": lambda s: s.counted(b"$%d\r\n" % CLAIMED, b"x", CLAIMED),
    # Every element below the bound, their sum far above it.
    "an array of 10^6 strings of 1 KiB": lambda s: s.counted(b"*1000000\r\n", _bulk(b"x" * 1024), 1 << 30),
    "a status line of 256 MiB": lambda s: s.counted(b"+", b"x", CLAIMED),
    "256 MiB inside the acquire reply": lambda s: s.counted(b"*3\r\n:1\r\n$%d\r\n" % CLAIMED, b"x", CLAIMED),
}


@pytest.mark.parametrize(("kind", "resp3"), [*((kind, False) for kind in HUGE), ("a bulk string of 256 MiB", True)])
async def test_a_reply_larger_than_the_bound_is_refused_before_it_is_read(kind: str, resp3: bool) -> None:
    """The campaign ends at once with a permanent error naming the bound; the client reads a few MiB at most
    (what the sockets' buffers hold), never the reply the server announced. Whether the server takes RESP3
    (HELLO 3) or the client falls back to RESP2 (another parser), the bound holds."""
    async with hostile(HUGE[kind], resp3=resp3) as server:
        started = time.monotonic()
        async with RedisElector(server.url, name=unique_name(), **REDIS) as elector:  # type: ignore[arg-type]
            with pytest.raises(PermanentBackendError, match=f"larger than {MAX_REPLY} bytes") as refused:
                await elector.acquire(timeout=20)
        took = time.monotonic() - started
    print(f"{kind}: refused after {took:.2f}s, {server.sent / 2**20:.1f} MiB sent: {refused.value}")
    assert server.sent < 32 << 20 and took < 10, (server.sent, took)


@pytest.mark.parametrize(
    ("reply", "shown"),
    [
        (b":7\r\n", "7"),
        (b"*3\r\n" + _bulk("abc") + _bulk("v") + b":4000\r\n", "'abc'"),
        (b"*2\r\n:1\r\n:4000\r\n", "[1, 4000]"),
        (b"*3\r\n:1\r\n:5\r\n$2\r\nxx\r\n", "'xx'"),
    ],
)
async def test_an_acquire_reply_of_another_shape_is_refused(reply: bytes, shown: str) -> None:
    async with (
        hostile(lambda _: fixed(reply)) as server,
        RedisElector(server.url, name=unique_name(), **REDIS) as elector,  # type: ignore[arg-type]
    ):
        with pytest.raises(PermanentBackendError, match="acquire script") as refused:
            await elector.acquire(timeout=20)
    assert shown in str(refused.value), refused.value


def _peak_rss_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


async def test_aioelect_run_against_a_server_announcing_256_mib_stays_small_and_exits_3(tmp_path: Path) -> None:
    """``aioelect run`` whose acquire script is answered with a 256 MiB bulk string: exit status 3 at once,
    CMD never started, the process's peak memory below 150 MiB (it was 1.2 GB for a 400 MiB string)."""
    ran = tmp_path / "ran"
    async with hostile(HUGE["a bulk string of 256 MiB"]) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIOELECT_")}
        env["PYTHONPATH"] = str(ROOT)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aioelect", "run", "--redis", server.url, "--name", unique_name(),
            "--", "sh", "-c", f"touch {ran}",
            env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        peak = 0
        try:
            communicated = asyncio.ensure_future(process.communicate())
            deadline = time.monotonic() + 60
            while not communicated.done() and time.monotonic() < deadline:
                peak = max(peak, _peak_rss_kib(process.pid))
                await asyncio.sleep(0.01)
            _, stderr = await asyncio.wait_for(communicated, 10)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    text = stderr.decode(errors="replace")
    print(f"exit {process.returncode}, peak RSS {peak / 1024:.0f} MiB, {server.sent / 2**20:.1f} MiB sent")
    assert process.returncode == 3 and f"larger than {MAX_REPLY} bytes" in text, text[-3000:]
    assert not ran.exists() and "Traceback" not in text, text[-3000:]
    assert peak < 150 * 1024 and server.sent < 32 << 20, (peak, server.sent)


# --- fencing tokens: positive, and larger than any this elector held -------------------------------------------


def token_key(name: str) -> str:
    return f"aioelect:{{{name}}}:token"


def lock_key(name: str) -> str:
    return f"aioelect:{{{name}}}:lock"


# -1: the counter's next value is 0, which the script took for "another holds it" while holding the key itself;
# past 2^53 the script's Lua numbers (doubles) handed two leaders the same token.
@pytest.mark.parametrize("counter", ["-1", "-6", "-1000", "9007199254740991", "1796413000000000000"])
async def test_a_token_that_is_not_positive_is_refused_and_the_lock_given_back(
    redis_server: RedisServer, counter: str
) -> None:
    name = unique_name()
    redis_server.command("SET", token_key(name), counter)
    async with RedisElector(redis_server.url, name=name, **REDIS) as elector:  # type: ignore[arg-type]
        with pytest.raises(PermanentBackendError, match=r"token counter .* is out of range \(1 to 2\^53-1\)"):
            await elector.acquire(timeout=10)
        assert not elector.leading
        assert redis_server.command("EXISTS", lock_key(name)) == 0, "the refused grant is given back"
        # Once the operator repairs the counter, the same elector leads again.
        redis_server.command("SET", token_key(name), "41")
        lead = await elector.acquire(timeout=10)
        assert lead.token == 42
        await lead.release()


async def test_a_token_not_above_the_last_one_held_is_refused(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique_name()
    redis_server.command("SET", token_key(name), "10")
    async with RedisElector(redis_server.url, name=name, **REDIS) as elector:  # type: ignore[arg-type]
        lead = await elector.acquire(timeout=10)
        first = lead.token
        assert first == 11
        await lead.release()
        for counter in (first - 1, first - 3):  # the next grant repeats the last token, then goes below it
            redis_server.command("SET", token_key(name), str(counter))
            with pytest.raises(PermanentBackendError, match=f"fencing token {counter + 1}, not above {first}"):
                await elector.try_acquire()
            assert redis_server.command("EXISTS", lock_key(name)) == 0
        redis_server.command("SET", token_key(name), str(first + 5))
        lead = await elector.acquire(timeout=10)
        assert lead.token == first + 6
        await lead.release()
    assert any("not above" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    # volatile_tokens=True opts into tokens that may repeat: accepted, with a WARNING.
    caplog.clear()
    async with RedisElector(redis_server.url, name=name, volatile_tokens=True, **REDIS) as elector:  # type: ignore[arg-type]
        lead = await elector.acquire(timeout=10)
        held = lead.token
        assert held is not None
        await lead.release()
        redis_server.command("SET", token_key(name), str(held - 1))
        lead = await elector.acquire(timeout=10)
        assert lead.token == held
        await lead.release()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"fencing token {held}, not above {held}" in m and "volatile" in m for m in warnings), warnings


def test_aioelect_run_refuses_a_negative_token_and_never_starts_cmd(redis_server: RedisServer, tmp_path: Path) -> None:
    name, ran = unique_name(), tmp_path / "ran"
    redis_server.command("SET", token_key(name), "-6")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOELECT_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "aioelect", "run", "--redis", redis_server.url, "--name", name,
         "--", "sh", "-c", f'echo "$AIOELECT_TOKEN" > {ran}'],
        capture_output=True, text=True, timeout=60, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 3 and "is out of range (1 to 2^53-1)" in done.stderr, done.stderr[-3000:]
    assert not ran.exists() and "token -5)" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert redis_server.command("EXISTS", lock_key(name)) == 0
