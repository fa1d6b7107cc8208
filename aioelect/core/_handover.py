"""Planned handovers: the note a leader leaves in its election's fenced state as it steps down, and the rule every
candidate applies to a leadership it is granted while such a note is open.

A leader stepping down writes the note under its own token (a fenced write:
a deposed leader cannot leave one), then releases. The note names who steps
down, who may lead next (``successor``; None: anyone but the one stepping
down) and until when. A candidate granted the lock reads the note before the
grant becomes a leadership: if the note is open and excludes it, the grant is
given back at once, never reported as a leadership, and the candidate waits
(reading the note, not taking the lock) until the note is taken, or ends.
The candidate that leads under an open note marks it taken, under its own
token, so that it excludes nobody any more.

The note is a preference, never a safety rule: mutual exclusion and tokens
stay the backend's. A note that cannot be read (the server slow or gone, a
value written by hand) excludes nobody, with a WARNING.
"""

from __future__ import annotations

import dataclasses
import json
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from ._backend import Backend, Hold, StateStore, Written, monotonic
from ._config import validate_identity
from ._errors import BackendUnavailable, ElectionError, PermanentBackendError, UsageError
from ._health import Health
from ._log import ElectionLog
from ._values import encode

__all__ = ["LEADER_KEY", "NOTE_KEY", "REQUEST_KEY", "WAITING_KEY", "Gate", "Note", "Priority", "Request"]

#: The fenced state key of the handover note (the store's own keys are the user's: this one is reserved).
NOTE_KEY = "aioelect.handover"
#: The key of a step-down request (posted, not fenced: any process may ask).
REQUEST_KEY = "aioelect.step-down"
#: The key where a leader with a priority records it (fenced: only the newest leader's record can be there).
LEADER_KEY = "aioelect.leader"
#: The key where the waiting candidate of the highest priority says so (posted, not fenced: any candidate may).
WAITING_KEY = "aioelect.waiting"
#: How often that candidate says so again; its word lapses after three times this.
WAITING_INTERVAL = 1.0
#: The window a higher-priority candidate asks for: only it may lead next, for this long.
PRIORITY_WINDOW = 30.0
#: The window of a release that passes to the waiting candidate of higher priority (it is campaigning: it takes
#: the lock at once; if it died meanwhile, the election opens to all after this).
RELEASE_WINDOW = 5.0
#: Bound on the read of :data:`WAITING_KEY` by a leader that releases, and on its note: past it, a plain release.
RELEASE_READ_TIMEOUT = 1.0
#: How often a candidate an open note excludes reads it again.
POLL_INTERVAL = 0.5
#: Bound on one read or write of the note: past it the note is treated as absent (a preference, never a wait).
NOTE_TIMEOUT = 5.0


@dataclasses.dataclass(frozen=True)
class Note:
    """A handover in progress (or done: ``taken_by``), as stored under :data:`NOTE_KEY`."""

    #: Who steps down, and the token it held.
    source: str
    token: int
    #: Who alone may lead next; None: anyone but ``source``.
    successor: str | None
    #: Wall-clock end of the window (time.time()), and its length: a candidate also ends it ``timeout`` after it
    #: first saw the note on its own monotonic clock, so a clock set apart from the leader's cannot stretch it.
    until: float
    timeout: float
    reason: str
    #: The candidate that led under the note: from then on it excludes nobody.
    taken_by: str | None = None
    #: The step-down request (its id) the note answers, if one asked for it.
    request: str | None = None

    def encode(self) -> bytes:
        return encode(dataclasses.asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> Note:
        """The note ``raw`` holds; ValueError if it is not one."""
        try:
            fields = json.loads(raw)
            note = cls(**fields)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a handover note: {raw[:120]!r}") from exc
        if not isinstance(note.source, str) or not isinstance(note.timeout, (int, float)):
            raise ValueError(f"not a handover note: {raw[:120]!r}")
        return note

    def excludes(self, identity: str) -> bool:
        """Whether the note keeps ``identity`` from leading while it is open."""
        if self.taken_by is not None:
            return False
        return identity != self.successor if self.successor is not None else identity == self.source

    def describe(self) -> str:
        to = f"to {self.successor!r}" if self.successor is not None else "to any other candidate"
        return f"handover from {self.source!r} (token {self.token}) {to}, reason {self.reason!r}"


@dataclasses.dataclass(frozen=True)
class Request:
    """A step-down asked of whoever leads, as posted under :data:`REQUEST_KEY`; it lapses at ``until``."""

    id: str
    successor: str | None
    timeout: float
    until: float
    by: str
    reason: str = "request"

    def encode(self) -> bytes:
        return encode(dataclasses.asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> Request:
        try:
            request = cls(**json.loads(raw))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a step-down request: {raw[:120]!r}") from exc
        if not isinstance(request.id, str) or not all(
            isinstance(n, (int, float)) for n in (request.timeout, request.until)
        ):
            raise ValueError(f"not a step-down request: {raw[:120]!r}")
        if not 0 < request.timeout < math.inf:
            raise ValueError(f"not a step-down request (its window): {raw[:120]!r}")
        if request.successor is not None:
            try:
                validate_identity(request.successor)
            except ValueError:
                raise ValueError(f"not a step-down request (its successor): {raw[:120]!r}") from None
        return request


@dataclasses.dataclass(frozen=True)
class Priority:
    """A candidate's priority, and how long it waits (healthy) before it asks a lower-priority leader to hand over."""

    value: int
    settle: float = 10.0


class Gate:
    """The handover rule of one elector's campaigns: a grant becomes a leadership only if no open note excludes it.

    Guarantees: a grant an open note excludes is released before anything
    else sees it as a leadership; the candidate then asks for the lock again
    only once the note is taken or has ended (``timeout`` after it was
    written, or after this candidate first saw it, whichever is first). A
    backend without fenced state (local, or fencing off) has no notes: every
    grant passes.
    """

    def __init__(self, backend: Backend, log: ElectionLog) -> None:
        self._backend = backend
        self._log = log
        #: When this candidate first saw each note (by source and token), on its monotonic clock.
        self._first_seen: dict[tuple[str, int], float] = {}
        #: The health check that must pass before each campaign, if any.
        self.health: Health | None = None
        #: This candidate's priority, if it has one.
        self.priority: Priority | None = None

    def store(self) -> StateStore | None:
        """The election's fenced state, or None where the backend keeps none."""
        try:
            return self._backend.state_store()
        except UsageError:
            return None

    def left(self, note: Note) -> float:
        """Seconds until ``note``'s window ends, as this candidate counts them (0: ended)."""
        seen = self._first_seen.setdefault((note.source, note.token), monotonic())
        return max(0.0, min(note.until - time.time(), seen + note.timeout - monotonic()))

    async def read(self) -> tuple[Note | None, bytes | None]:
        """The note and its stored bytes; (None, None) if there is none or it cannot be read (logged)."""
        store = self.store()
        if store is None:
            return None, None
        raw: bytes | None = None
        with anyio.move_on_after(NOTE_TIMEOUT) as scope:
            try:
                raw = await store.read(NOTE_KEY)
            except ElectionError as exc:
                self._log.warning("handover note unreadable (%s): it excludes nobody", exc)
                return None, None
        if scope.cancelled_caught:
            self._log.warning("handover note unread after %gs: it excludes nobody", NOTE_TIMEOUT)
        if raw is None:
            return None, None
        try:
            return Note.decode(raw), raw
        except ValueError as exc:
            self._log.warning("%s: it excludes nobody", exc)
            return None, None

    async def campaign(self, identity: str) -> Hold:
        """The backend's campaign, until a grant passes the handover rule."""
        while True:
            if self.health is not None:
                await self.health.until_healthy(self._log)
            hold = await self._campaign_asking(identity)
            if await self._closing_state(self._admit(hold, identity, wait=True)):
                return hold

    async def _campaign_asking(self, identity: str) -> Hold:
        """The backend's campaign; with a priority, a lower-priority leader is asked to hand over meanwhile."""
        if self.priority is None:
            return await self._backend.campaign(identity)
        hold: Hold | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._say_waiting, identity, self.priority)
                tg.start_soon(self._ask_when_settled, identity, self.priority)
                hold = await self._backend.campaign(identity)
                tg.cancel_scope.cancel()
        except BaseException:
            if hold is not None:
                await _give_back(hold)
            raise
        assert hold is not None
        return hold

    async def _ask_when_settled(self, identity: str, priority: Priority) -> None:
        """Every ``settle`` seconds of waiting (healthy), ask a leader of lower priority to hand over to us.

        Only a strictly lower priority is asked: leadership moves only
        upwards, so it never flaps between two candidates. A leader that
        recorded no priority counts as priority 0.
        """
        while True:
            await anyio.sleep(priority.settle)
            try:
                if self.health is not None and await self.health.problem() is not None:
                    continue
                leader = await self._backend.leader()
                if leader is None or leader == identity:
                    continue
                theirs = await self.leader_priority(leader)
                if theirs >= priority.value:
                    continue
                note, _ = await self.read()
                if note is not None and note.taken_by is None and self.left(note) > 0:
                    continue  # a handover is under way
                self._log.info(
                    "priority %d above leader %r's %d after %gs waiting: asking it to hand over",
                    priority.value,
                    leader,
                    theirs,
                    priority.settle,
                )
                request = Request(
                    secrets.token_hex(8), identity, PRIORITY_WINDOW, time.time() + priority.settle, identity, "priority"
                )
                await self.post(request)
            except ElectionError as exc:
                self._log.warning("priority: the leader could not be asked (%s); trying again", exc)

    async def _say_waiting(self, identity: str, priority: Priority) -> None:
        """While waiting (healthy), keep :data:`WAITING_KEY` naming the waiting candidate of the highest priority.

        A leader that releases hands over to it (:meth:`waiting_successor`),
        so that a rolling deploy stopping the leader before any settle time
        has passed still moves leadership to the newer version, once. Only a
        candidate of a higher priority than the leader's writes it (the others'
        word could not change a release), and only if absent, lapsed, ours, or
        of a lower priority.
        """
        while True:
            await anyio.sleep(WAITING_INTERVAL)
            await self.announce(identity)

    async def announce(self, identity: str) -> None:
        """Say once, if it is so, that ``identity`` waits with a priority above the leader's (see
        :meth:`_say_waiting`); bounded by :data:`WAITING_INTERVAL`, a failure logged and otherwise ignored."""
        store, priority = self.store(), self.priority
        if store is None or priority is None:
            return
        with anyio.move_on_after(WAITING_INTERVAL):
            try:
                if self.health is not None and await self.health.problem() is not None:
                    return
                if priority.value <= _recorded(await store.read(LEADER_KEY)):
                    return
                now = time.time()
                current = _waiting(await store.read_posted(WAITING_KEY))
                if current is None or current[2] < now or current[0] == identity or current[1] < priority.value:
                    record = {"identity": identity, "priority": priority.value, "until": now + 3 * WAITING_INTERVAL}
                    await store.post(WAITING_KEY, encode(record))
            except ElectionError as exc:
                self._log.debug("priority: waiting not posted (%s)", exc)

    async def waiting_successor(self, identity: str) -> str | None:
        """For a leader with a priority that releases: the waiting candidate of a higher priority, if one says so.

        None (a plain release) without a priority, without fenced state, or
        if the record cannot be read within :data:`RELEASE_READ_TIMEOUT`.
        """
        store = self.store()
        if self.priority is None or store is None:
            return None
        raw: bytes | None = None
        with anyio.move_on_after(RELEASE_READ_TIMEOUT):
            try:
                raw = await store.read_posted(WAITING_KEY)
            except ElectionError as exc:
                self._log.warning("priority: who waits unread (%s): a plain release", exc)
        current = _waiting(raw)
        if current is None or current[2] < time.time() or current[0] == identity:
            return None
        return current[0] if current[1] > self.priority.value else None

    async def leader_priority(self, leader: str) -> int:
        """The priority ``leader`` recorded as it took the lead; 0 if it recorded none."""
        store = self.store()
        raw = None if store is None else await store.read(LEADER_KEY)
        try:
            record = json.loads(raw) if raw is not None else None
            if isinstance(record, dict) and record.get("identity") == leader:
                return int(record["priority"])
        except (TypeError, ValueError, KeyError, OverflowError):
            pass
        return 0

    async def lead(
        self, hold: Hold, identity: str, held: Callable[[], bool], act: Callable[[Request], Awaitable[None]]
    ) -> None:
        """While leading with a priority: record it, then act on step-down requests as they come."""
        store = self.store()
        if store is not None and self.priority is not None:
            record = encode({"identity": identity, "priority": self.priority.value})
            try:
                await store.write(hold, LEADER_KEY, record, compare=False, expected=None)
            except ElectionError as exc:
                self._log.warning("priority not recorded (%s): candidates count this leader as priority 0", exc)
        await self.serve(held, act, identity=identity)

    async def serve(
        self,
        held: Callable[[], bool],
        act: Callable[[Request], Awaitable[None]],
        interval: float = POLL_INTERVAL * 2,
        *,
        identity: str,
    ) -> None:
        """While ``held()``, poll every ``interval`` for a step-down request and ``act`` on the first one.

        A request whose successor is ``identity`` (the leader itself) is already answered and is never acted on.
        Returns only once it acted or ``held()`` is False: a backend that refuses the requests' table for good
        (a privilege missing) is said once, at WARNING, and not asked again.
        """
        refused = False
        while held():
            request = None
            try:
                if not refused:
                    request = await self.pending(identity)
            except PermanentBackendError as exc:
                self._log.warning("step-down requests cannot be read (%s): this leader does not serve them", exc)
                refused = True
            except ElectionError as exc:
                self._log.warning("step-down requests unread (%s); retrying in %gs", exc, interval)
            if request is not None and held():
                self._log.info("step-down requested by %s (request %s, %s)", request.by, request.id, request.reason)
                await act(request)
                return
            await anyio.sleep(interval)

    async def try_campaign(self, identity: str) -> Hold | None:
        """The backend's one campaign step; None also when an open note excludes ``identity`` (grant given back)."""
        if self.health is not None:
            why = "staying out after stepping down unhealthy" if self.health.out_until > monotonic() else None
            why = why or await self.health.problem()
            if why is not None:
                self._log.warning("not campaigning: %s", why)
                return None
        hold = await self._backend.try_campaign(identity)
        if hold is None or await self._closing_state(self._admit(hold, identity, wait=False)):
            return hold
        return None

    async def _closing_state(self, step: Awaitable[bool]) -> bool:
        """``await step``; the state's connection, if this opened it, closed after (an idle elector holds none)."""
        opened = self._backend._state_store is None
        try:
            return await step
        finally:
            if opened:
                await self._backend.close_state()

    async def _admit(self, hold: Hold, identity: str, *, wait: bool) -> bool:
        try:
            note, raw = await self.read()
            if note is None or note.taken_by is not None:
                return True
            left = self.left(note)
            if left > 0 and note.excludes(identity):
                await _give_back(hold)
                self._log.info("%s in progress: grant given back; staying out for up to %.1fs", note.describe(), left)
                if wait:
                    await self._wait_out(identity)
                return False
            if left <= 0 and note.successor is not None and note.successor != identity:
                self._log.warning(
                    "%s not taken within %gs: the election opened to all candidates", note.describe(), note.timeout
                )
            await self._mark_taken(hold, note, raw, identity)
            return True
        except BaseException:
            with anyio.CancelScope(shield=True):
                await _give_back(hold)
            raise

    async def _mark_taken(self, hold: Hold, note: Note, raw: bytes | None, identity: str) -> None:
        store = self.store()
        if store is None or hold.token is None:
            return
        taken = dataclasses.replace(note, taken_by=identity)
        with anyio.move_on_after(NOTE_TIMEOUT):
            try:
                written = await store.write(hold, NOTE_KEY, taken.encode(), compare=True, expected=raw)
            except ElectionError as exc:
                self._log.warning("handover note not marked taken (%s): it ends at its deadline", exc)
                return
            if written is Written.DONE:
                self._log.info("%s: taken by %r", note.describe(), identity)

    async def _wait_out(self, identity: str) -> None:
        """Return once no open note excludes ``identity`` (taken, ended, or gone)."""
        while True:
            note, _ = await self.read()
            if note is None or not note.excludes(identity):
                return
            left = self.left(note)
            if left <= 0:
                return
            await anyio.sleep(min(POLL_INTERVAL, left))

    async def post(self, request: Request) -> None:
        """Post ``request`` for whoever leads; UsageError where the backend keeps no notes."""
        store = self._notes_store()
        await store.post(REQUEST_KEY, request.encode())

    async def pending(self, leader: str) -> Request | None:
        """The step-down request ``leader`` should act on now: posted, not lapsed, not answered by the note, and
        not naming ``leader`` itself as the successor (it leads already: the leader changed by a release or an
        expiry before anyone acted on the request)."""
        store = self.store()
        if store is None:
            return None
        raw = await store.read_posted(REQUEST_KEY)
        if raw is None:
            return None
        try:
            request = Request.decode(raw)
        except ValueError as exc:
            self._log.warning("%s: ignored", exc)
            return None
        if request.until <= time.time() or request.successor == leader:
            return None
        note, _ = await self.read()
        return None if note is not None and note.request == request.id else request

    def _notes_store(self) -> StateStore:
        store = self.store()
        if store is None:
            raise UsageError(
                f"the {self._backend.kind} backend keeps no handover note (it needs fenced state: etcd, MySQL, "
                "PostgreSQL with schema=, Redis, file, memory, with fencing tokens)"
            )
        return store

    async def leave(self, hold: Hold, note: Note, bound: float = NOTE_TIMEOUT) -> bool:
        """Write ``note`` under ``hold``'s token: True; False if the token is not the newest (nothing written).

        UsageError where the backend keeps no notes; BackendUnavailable if the
        write did not finish within ``bound`` seconds.
        """
        store = self._notes_store()
        written: Written | None = None
        with anyio.move_on_after(bound):
            written = await store.write(hold, NOTE_KEY, note.encode(), compare=False, expected=None)
        if written is None:
            raise BackendUnavailable(f"handover note not written within {bound:g}s: still leading")
        return written is not Written.FENCED


def _recorded(raw: bytes | None) -> int:
    """The priority under :data:`LEADER_KEY` (the newest leader that recorded one); 0 if none."""
    try:
        record = json.loads(raw) if raw is not None else None
        if isinstance(record, dict):
            return int(record["priority"])
    except (TypeError, ValueError, KeyError, OverflowError):
        pass
    return 0


def _waiting(raw: bytes | None) -> tuple[str, int, float] | None:
    """The record under :data:`WAITING_KEY`: (identity, priority, until); None if absent or not one (an identity
    no candidate could have, a priority no integer holds)."""
    try:
        record = json.loads(raw) if raw is not None else None
        if isinstance(record, dict):
            identity = validate_identity(record["identity"])
            return identity, int(record["priority"]), float(record["until"])
    except (TypeError, ValueError, KeyError, OverflowError):
        pass
    return None


async def _give_back(hold: Hold) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(NOTE_TIMEOUT):
        await hold.release()


def note_fields(note: Note | None, left: Callable[[Note], float]) -> dict[str, Any] | None:
    """A note as the CLI shows it (None: no handover in progress)."""
    if note is None or note.taken_by is not None:
        return None
    remaining = left(note)
    if remaining <= 0:
        return None
    return {"from": note.source, "to": note.successor, "reason": note.reason, "seconds_left": round(remaining, 1)}
