"""The ingest path every protocol's publishes take into the store: one submission per read
batch to the store's group commit, a message the store cannot take refused alone, and reading
from the client paused while too much of what it sent is still on its way to the store (so
ingest can neither starve delivery nor grow memory without bound). The caller acknowledges to
its client from ``on_stored``, after the store's acknowledgement: never before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

from store import Message, PutResult, StoreError

from ..read_pauses import ReadPauses
from ..trace import Tracer

# A connection is not read from while more than this many of its publishes are on their way
# to the store, or more than this many bytes of their bodies; reading resumes at half.
MAX_PENDING_PUTS = 4096
MAX_PENDING_BYTES = 16 << 20

Items = Sequence[tuple[Message, Sequence[str]]]
Refused = dict[int, StoreError]


class PutTarget(Protocol):
    """``store.MessageStore.put_each_nowait`` (and the cluster's ``GatewayStore``)."""

    def put_each_nowait(self, items: Items, groups: Sequence[Hashable] | None = None
                        ) -> tuple[asyncio.Future[Sequence[PutResult]], Refused]: ...


class PutPipeline:
    __slots__ = ("bytes", "listener", "pending", "read_pauses", "store", "watcher", "who")

    def __init__(self, store: PutTarget, read_pauses: ReadPauses, *, listener: str,
                 watcher: Tracer | None = None) -> None:
        self.store = store
        self.read_pauses = read_pauses
        self.listener = listener  # for the trace: which listener the messages came in by
        self.who = ""  # ... and from whom (a client id, a peer address)
        self.watcher = watcher
        self.pending = 0  # publishes submitted, not yet stored
        self.bytes = 0  # their bodies' bytes

    def submit(self, items: Items, on_stored: Callable[[asyncio.Future[Sequence[PutResult]], Refused], None],
               groups: Sequence[Hashable] | None = None) -> Refused:
        """Hand ``items`` to the store's next group commit; ``on_stored(future, refused)`` runs
        when they are stored (or failed), refused ones (index in ``items`` -> error) left out.
        StoreError: the store takes nothing now (closing, failed); nothing was submitted."""
        received_at = time.time() if self.watcher is not None else None  # (a lone put may be stored, and
        # delivered, before put_each_nowait returns: the trace's publish is when it was read)
        fut, refused = self.store.put_each_nowait(items, groups)
        stored = items if not refused else [item for i, item in enumerate(items) if i not in refused]
        self.track(fut, stored, refused, on_stored, received_at)
        return refused

    def track(self, fut: asyncio.Future[Sequence[PutResult]], stored: Items, refused: Refused,
              on_stored: Callable[[asyncio.Future[Sequence[PutResult]], Refused], None],
              received_at: float | None = None) -> None:
        """A put submitted by the caller (``submit``'s, or a numbered put of its own), counted
        with the others until ``fut`` is done, then ``on_stored(fut, refused)``; ``received_at``:
        when its messages were read (the trace's publish time; None: now)."""
        count, size = len(stored), sum(len(message.body) for message, _ in stored)
        self.pending += count
        self.bytes += size
        if self.pending > MAX_PENDING_PUTS or self.bytes > MAX_PENDING_BYTES:
            self.read_pauses.pause("puts")
        if self.watcher is not None and stored:
            self.watcher.watch_put(self.listener, self.who, stored, fut, received_at)

        def done(f: asyncio.Future[Sequence[PutResult]]) -> None:
            self.pending -= count
            self.bytes -= size
            if self.pending <= MAX_PENDING_PUTS // 2 and self.bytes <= MAX_PENDING_BYTES // 2:
                self.read_pauses.resume("puts")
            on_stored(f, refused)

        fut.add_done_callback(done)
