"""The ordered write path from an embedded lookup node to one owner: ops queue up while a batch
is in flight and leave together in the next one; one batch at a time keeps them in order, and a
sync (the node's snapshot for that owner) goes alone, between the writes before and after it."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from .api import FallbackReason

if TYPE_CHECKING:
    from .embedded import EmbeddedLookup

log = logging.getLogger("tidemq.lookup")

MAX_BATCH = 1000  # ops per batch request
SYNC = ("sync",)  # placeholder op: the snapshot is taken when the outbox gets to it
Result = tuple[str, Any]  # ("ok", value) or ("doubt", reason)


class Outbox:
    def __init__(self, lookup: EmbeddedLookup, peer: str) -> None:
        self._lookup = lookup
        self._peer = peer
        self._pending: list[tuple[tuple[str, ...], asyncio.Future[Result]]] = []
        self._inflight: list[tuple[tuple[str, ...], asyncio.Future[Result]]] = []
        self._wake = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name=f"lookup-outbox-{lookup.node_id}-{peer}")

    def submit(self, op: tuple[str, ...]) -> asyncio.Future[Result]:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._pending.append((op, future))
        self._wake.set()
        return future

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                # a sync goes alone; the writes before and after it keep their order around it
                size = next((i for i, (op, _) in enumerate(self._pending) if op is SYNC), len(self._pending))
                size = min(max(size, 1), MAX_BATCH)
                batch, self._pending = self._pending[:size], self._pending[size:]
                self._inflight = batch
                try:
                    if batch[0][0] is SYNC:
                        await self._lookup._send_sync(self._peer, batch[0][1])
                    else:
                        await self._lookup._send_batch(self._peer, batch)
                except Exception:  # a caller must never hang on its write
                    log.exception("lookup write batch failed node=%s peer=%s", self._lookup.node_id, self._peer)
                    self._lookup._sync_queued.discard(self._peer)
                    resolve(batch, FallbackReason.UNREACHABLE)
                finally:
                    self._inflight = []

    def close(self) -> None:
        self.task.cancel()
        resolve(self._inflight + self._pending, FallbackReason.SETTLING)
        self._pending = []
        self._lookup._sync_queued.discard(self._peer)


def resolve(batch: list[tuple[tuple[str, ...], asyncio.Future[Result]]], reason: FallbackReason) -> None:
    for _, future in batch:
        if not future.done():
            future.set_result(("doubt", reason.value))
