"""Background tasks: stopping them is one thing, done one way, in every layer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


async def cancel_and_wait(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel ``tasks`` and wait until each has finished (its own error, if any, is dropped:
    a part that is stopping has nothing left to do with it)."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
