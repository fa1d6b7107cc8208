"""aioelect's MySQL or PostgreSQL backend with one shared session per process (opt-in ``MySQLSession`` /
``PostgresSession``, by the URL's scheme).

Every slot of the process is a ``MySQLElector(session=..., name=...)`` (or
``PostgresElector``) on one session: one connection for the whole process,
whatever the number of elections. Acting as leader means ``Leadership.held``.
The session opens with the first slot and closes after the last.
"""

from __future__ import annotations

from typing import Any

import aioelect

from ._runner import Candidate, Options, main
from .aioelect_etcd_shared import SharedSessionCandidate


class SqlSharedCandidate(SharedSessionCandidate):
    @property
    def _postgres(self) -> bool:
        return self.options.url.startswith(("postgres://", "postgresql://"))

    def new_session(self) -> Any:
        lease = {} if self.options.lease is None else {"lease": self.options.lease}
        if self._postgres:
            return aioelect.PostgresSession(self.options.url, **lease)
        return aioelect.MySQLSession(self.options.url, **lease)

    def new_elector(self, session: Any) -> Any:
        if self._postgres:
            return aioelect.PostgresElector(session=session, name=self.options.name)
        return aioelect.MySQLElector(session=session, name=self.options.name)


def make(options: Options, slot: int) -> Candidate:
    return SqlSharedCandidate(options)


if __name__ == "__main__":
    main(make)
