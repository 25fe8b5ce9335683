"""Notify: tells interested parties "queue X now ends at offset N" after each dispatch.

Events for the same queue coalesce while a subscriber is busy, so a slow subscriber
costs one dict entry per queue, never a backlog of events. A listener that heard a commit's
events acts once that commit is complete (``after_commit``): at the end of the committer's
turn, ahead of anything the commit scheduled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

log = logging.getLogger("tidemq.store")


class NotifySubscription:
    """An async iterator of coalesced ``(queue, max_offset)`` events."""

    def __init__(self, hub: "NotifyHub") -> None:
        self._hub = hub
        self._pending: dict[str, int] = {}
        self._ready: list[tuple[str, int]] = []
        self._wakeup = asyncio.Event()
        self._closed = False

    def _publish(self, events: dict[str, int]) -> None:
        pending = self._pending
        for queue, offset in events.items():
            if pending.get(queue, -1) < offset:
                pending[queue] = offset
        self._wakeup.set()

    def __aiter__(self) -> AsyncIterator[tuple[str, int]]:
        return self

    async def __anext__(self) -> tuple[str, int]:
        while not self._ready:
            if self._closed:
                raise StopAsyncIteration
            if self._pending:
                self._ready = list(self._pending.items())
                self._ready.reverse()
                self._pending = {}
                break
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._ready.pop()

    def drain(self) -> dict[str, int]:
        """Take every pending event at once (for consumers that batch)."""
        events = dict(reversed(self._ready))
        for queue, offset in self._pending.items():
            events[queue] = max(offset, events.get(queue, -1))
        self._ready = []
        self._pending = {}
        return events

    def close(self) -> None:
        self._closed = True
        self._hub._subscriptions.discard(self)
        self._wakeup.set()

    async def feed(self, handle: Callable[[str, int], None]) -> None:
        """Call ``handle(queue, max_offset)`` for every event until cancelled, then close."""
        try:
            async for queue, max_offset in self:
                handle(queue, max_offset)
                for q, offset in self.drain().items():
                    handle(q, offset)
        finally:
            self.close()


class NotifyHub:
    def __init__(self) -> None:
        self._subscriptions: set[NotifySubscription] = set()
        self._listeners: list[Callable[[dict[str, int]], None]] = []
        self._after: list[Callable[[], None]] | None = None  # while the committer commits (commit_begins)
        self.events_published = 0  # (queue, max offset) events sent to subscribers

    def subscribe(self) -> NotifySubscription:
        sub = NotifySubscription(self)
        self._subscriptions.add(sub)
        return sub

    def listen(self, listener: Callable[[dict[str, int]], None]) -> None:
        """Call ``listener(events)`` at each publish, before any subscription is woken: for a
        party that must know every queue's end before anyone else acts on the events."""
        self._listeners.append(listener)

    def unlisten(self, listener: Callable[[dict[str, int]], None]) -> None:
        """Stop calling ``listener`` (a party that stops while the store goes on: a store node's
        brokers and queue cache end with each spell of leading)."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """For a listener: run ``callback()`` once the commit it heard of is complete (tail
        readers handed its messages, its puts answered or waiting for the disk): at the end of
        the committer's turn, before anything scheduled meanwhile; outside the committer's
        commits (a replicated release, a follower's dispatch), on the loop's next turn."""
        if self._after is not None:
            self._after.append(callback)
        else:
            asyncio.get_running_loop().call_soon(callback)

    def commit_begins(self) -> None:
        """The committer starts a batch: ``after_commit`` callbacks wait for ``commit_ends``."""
        self._after = []

    def commit_ends(self) -> None:
        """The committer's batch is done: its ``after_commit`` callbacks run, in order."""
        after, self._after = self._after, None
        for callback in after or ():
            try:
                callback()
            except Exception:  # the commit stands whatever a callback does
                log.exception("notify after-commit callback failed")

    @property
    def active(self) -> bool:
        return bool(self._subscriptions) or bool(self._listeners)

    def publish(self, events: dict[str, int]) -> None:
        self.events_published += len(events)
        for listener in self._listeners:
            try:
                listener(events)
            except Exception:  # the events are published whatever a listener does
                log.exception("notify listener failed")
        for sub in self._subscriptions:
            sub._publish(events)

    def close(self) -> None:
        for sub in list(self._subscriptions):
            sub.close()
