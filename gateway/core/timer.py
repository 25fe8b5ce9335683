"""The one timer of the gateway: releases held timer messages (store/holds/held_messages.py) into their queues
at their due time, for every protocol that schedules them (RocketMQ's timer properties, MQTT's
``$delayed/``, AMQP's ``x-delayed-message``).

The pending timers live in the store's index, sorted by due time (no wheel to size or roll:
any delay is one key); this service keeps only the next due time. It sleeps until then, or
until a message due earlier is scheduled (``scheduled``; it looks every 50 ms anyway), and
releases what is due in batches,
each one group commit. After a restart it starts at once: what came due while the gateway was
down is released in its first turn.
"""

from __future__ import annotations

import asyncio
import logging
import time

from store import MessageStore, StoreError, now_ms
from store import TIMER
from store import LatencyHistogram

from ..tasks import cancel_and_wait


log = logging.getLogger("tidemq.timer")

RELEASE_BATCH = 1024  # held messages released per group commit
RETRY_S = 1.0  # after a failed release (the store refused: a full disk)
# the longest sleep: a timer message put through any path (a protocol's ingest) without a
# ``scheduled`` call is found by then, if it is due before the one the service waits for
LOOK_S = 0.05
# the metrics' view of what is coming: pending timers due within these many seconds, from a
# walk of at most DUE_SCAN_LIMIT keys per scrape
DUE_BOUNDS_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0, 86400.0)
DUE_SCAN_LIMIT = 100_000


class TimerService:
    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self._next_due: int | None = None  # ms; None: not known yet (look in the store)
        # every hold due before this was released (ms): where the store's keys are looked up from,
        # not their start, where the released ones' tombstones lie (store/holds/held_messages.py take_earliest)
        self._released_to = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.released = 0
        self.due_lag = LatencyHistogram()  # release time - due time (seconds), per message

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="timer")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    def scheduled(self, due_ms: int) -> None:
        """A timer message due at ``due_ms`` was stored (acknowledged): wake if it is the next."""
        if self._next_due is None or due_ms < self._next_due:
            self._next_due = due_ms
            self._wake.set()

    @property
    def pending(self) -> int:
        """Timer messages not yet released."""
        return self.store.held.count(TIMER)

    def due_within(self) -> list[tuple[float, int]]:
        """(seconds, pending timer messages due within them from now), per DUE_BOUNDS_S."""
        counts = self.store.held.due_within(TIMER, now_ms(), DUE_BOUNDS_S, DUE_SCAN_LIMIT)
        return list(zip(DUE_BOUNDS_S, counts))

    async def _run(self) -> None:
        held = self.store.held
        while True:
            self._wake.clear()
            now = now_ms()
            earliest = held.take_earliest(TIMER)
            if earliest is not None and earliest < self._released_to:
                self._released_to = earliest
            due = held.due(TIMER, now, RELEASE_BATCH, self._released_to)
            if due:
                try:
                    await held.release(due)
                except StoreError as exc:
                    log.warning("timer release failed; retried count=%d error=%s", len(due), exc)
                    await asyncio.sleep(RETRY_S)
                    continue
                released_at = now_ms()
                for hold in due:
                    self.due_lag.observe(max(0, released_at - hold.due_ms) / 1000)
                self.released += len(due)
                self._released_to = due[-1].due_ms  # (not past it: more of that ms may be left)
                continue  # more may be due
            self._next_due = held.next_due_ms(TIMER, self._released_to)
            delay = LOOK_S if self._next_due is None else min(LOOK_S, max(0.0, (self._next_due - now_ms()) / 1000))
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except TimeoutError:
                pass

