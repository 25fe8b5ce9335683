"""Session expiry, in one place for every kind of node: the sessions whose expiry ran out while
their clients were away end, every ``interval_s``. A node sweeps the sessions it holds in memory
(a standalone node: all of them; a gateway node: its clients' and those with a will pending); a
store node sweeps the stored sessions of its gateway nodes' absent clients. What ending a
session undoes (its filters, its stored record, a pending will) is the caller's ``end``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator

from store import StoreError
from store import RateLimitedLog
from store import KvTable

from .session import Session

log = logging.getLogger("tidemq.mqtt")


class SessionExpiry:
    """``candidates()``: the sessions whose client is away; ``end(session)`` ends one."""

    def __init__(self, candidates: Callable[[], Iterable[Session]], end: Callable[[Session], None]) -> None:
        self.candidates = candidates
        self.end = end
        self._failures = RateLimitedLog(log)

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.sweep()

    def sweep(self, now: float | None = None) -> list[str]:
        """End the expired sessions; their client ids."""
        now = time.time() if now is None else now
        ended = []
        for session in [s for s in self.candidates() if s.expired(now)]:
            log.debug("session expired client_id=%s", session.client_id)
            try:
                self.end(session)
            except StoreError as exc:  # not deleted: kept, and ended by a later sweep
                self._failures.log(logging.WARNING, type(exc).__name__, "expired session not ended client_id=%s error=%s",
                                   session.client_id, exc)
                continue
            ended.append(session.client_id)
        if ended:
            log.info("sessions expired count=%d", len(ended))
        return ended


def stored_sessions(table: KvTable) -> Iterator[Session]:
    """The sessions of a sessions table; an unreadable one as expired (no node can resume it)."""
    for client_id, raw in list(table.items()):
        try:
            yield Session.from_json(client_id, raw)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("unreadable session dropped client_id=%s error=%s", client_id, exc)
            yield Session(client_id, 0, 0, disconnected_at=0.0)
