"""The background work both lookup backends share: the heartbeat loop (one beat every interval
until the lookup closes, a failed beat logged and the next one tried) and stopping their tasks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

log = logging.getLogger("tidemq.lookup")


async def beat_until_closed(closed: Callable[[], bool], interval_s: float, beat: Callable[[], Awaitable[None]],
                            node_id: str) -> None:
    while not closed():
        await asyncio.sleep(interval_s)
        try:
            await beat()
        except Exception:  # a bug here must not stop the heartbeats
            log.exception("lookup heartbeat failed node=%s", node_id)


async def stop_tasks(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel ``tasks`` and wait for them (as gateway/tasks.py, which this layer may not import)."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
