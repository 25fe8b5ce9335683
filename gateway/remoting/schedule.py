"""Delayed messages by level (RocketMQ's ScheduleMessageService): a message sent with a delay
level -- by a producer (the DELAY property) or by a consumer giving a message back for a
retry -- is stored once into the level's store queue ``sched:{level}`` and, when its time
has come, stored again into its real target queues by ``deliver``.

Every message of one level has the same delay, so each level's queue is due in order: one
task per level waits for its head. Its position is the store consumer offset ``sched`` of
that queue, advanced only after the re-put is durable (a crash in between delivers again:
at least once, as RocketMQ).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable

from store import GetStatus, MessageStore, StoredMessage

from ..tasks import cancel_and_wait


log = logging.getLogger("tidemq.remoting")

SCHEDULE_QUEUE_PREFIX = "sched:"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
CURSOR = "sched"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_LEVEL = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def parse_delay_levels(text: str) -> list[float]:
    """RocketMQ's messageDelayLevel string ("1s 5s 10s ... 2h") -> seconds per level (1-based)."""
    levels = []
    for word in text.split():
        match = _LEVEL.match(word)
        if match is None:
            raise ValueError(f"bad delay level {word!r}: use a number with ms, s, m, h or d")
        levels.append(int(match.group(1)) * _UNITS[match.group(2)])
    if not levels:
        raise ValueError("no delay levels")
    return levels


def schedule_queue(level: int) -> str:
    return f"{SCHEDULE_QUEUE_PREFIX}{level}"


class ScheduleService:
    def __init__(self, store: MessageStore, delays_s: list[float],
                 deliver: Callable[[StoredMessage], Awaitable[None]]) -> None:
        self.store = store
        self.delays_s = delays_s
        self.deliver = deliver
        self._wake = {level: asyncio.Event() for level in range(1, len(delays_s) + 1)}
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def max_level(self) -> int:
        return len(self.delays_s)

    def clamp(self, level: int) -> int:
        return max(1, min(level, self.max_level))

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for level in self._wake:
            self._tasks.append(loop.create_task(self._run(level), name=f"schedule-{level}"))

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks.clear()

    def on_notify(self, store_queue: str) -> None:
        """The store has new data in ``store_queue`` (called from the node's notify loop)."""
        if store_queue.startswith(SCHEDULE_QUEUE_PREFIX):
            try:
                event = self._wake.get(int(store_queue[len(SCHEDULE_QUEUE_PREFIX):]))
            except ValueError:
                return
            if event is not None:
                event.set()

    async def _run(self, level: int) -> None:
        queue = schedule_queue(level)
        delay_ms = int(self.delays_s[level - 1] * 1000)
        offset = self.store.get_offset_now(CURSOR, queue) or 0
        wake = self._wake[level]
        while True:
            wake.clear()
            result = self.store.get_now(queue, offset, 32)
            if result.status is GetStatus.OFFSET_TOO_SMALL or result.status is GetStatus.OFFSET_OVERFLOW:
                offset = result.next_offset  # retention took them, or the cursor ran ahead
                continue
            if result.status is not GetStatus.FOUND:
                await wake.wait()
                continue
            for message in result.messages:
                wait_s = (message.store_timestamp + delay_ms) / 1000 - time.time()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                try:
                    await self.deliver(message)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("delayed message not delivered; retried in 1 s level=%d offset=%d",
                                  level, message.queue_offset)
                    await asyncio.sleep(1.0)
                    break
                offset = message.queue_offset + 1
                self.store.commit_offset_now(CURSOR, queue, offset)
