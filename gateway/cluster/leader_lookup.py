"""Where the store leader serves a service, looked up once for every connection that asks at
the same time (and the answer kept for a moment), so that a failover's many reconnecting
relays ask etcd a few times a second, not once each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

KEEP_S = 0.1  # an answer (or failure) is given to whoever asks this soon after


class LeaderLookup:
    def __init__(self, target: Callable[[], Awaitable[tuple[str, int]]]) -> None:
        self.target = target
        self._lookup: asyncio.Future[tuple[str, int]] | None = None
        self._done_at = 0.0

    async def __call__(self) -> tuple[str, int]:
        lookup = self._lookup
        if lookup is None or (lookup.done() and time.monotonic() - self._done_at > KEEP_S):
            lookup = self._lookup = asyncio.ensure_future(self.target())
            lookup.add_done_callback(self._finished)
        return await asyncio.shield(lookup)

    def _finished(self, lookup: asyncio.Future[tuple[str, int]]) -> None:
        self._done_at = time.monotonic()
        if not lookup.cancelled():
            lookup.exception()  # (retrieved: a failure is every waiter's, and no one's to log)
