"""Long polling (RocketMQ's PullRequestHoldService): a pull that finds no new message waits
until the store's notify says its queue has grown past the pulled offset, or until its
suspend timeout. No timer polls the store; one future per held pull."""

from __future__ import annotations

import asyncio


class PullHolds:
    def __init__(self) -> None:
        self._waiting: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}

    def __len__(self) -> int:
        return sum(len(w) for w in self._waiting.values())

    async def wait(self, store_queue: str, offset: int, timeout_s: float) -> bool:
        """Wait until ``store_queue`` has a message at ``offset`` or later: True if it came,
        False on timeout."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (offset, fut)
        self._waiting.setdefault(store_queue, []).append(entry)
        try:
            await asyncio.wait_for(fut, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            waiting = self._waiting.get(store_queue)
            if waiting is not None:
                try:
                    waiting.remove(entry)
                except ValueError:
                    pass
                if not waiting:
                    del self._waiting[store_queue]

    def on_notify(self, store_queue: str, max_offset: int) -> None:
        waiting = self._waiting.get(store_queue)
        if not waiting:
            return
        for offset, fut in waiting:
            if max_offset > offset and not fut.done():
                fut.set_result(None)

    def wake_all(self) -> None:
        """Answer every held pull now (shutdown)."""
        for waiting in self._waiting.values():
            for _, fut in waiting:
                if not fut.done():
                    fut.set_result(None)
