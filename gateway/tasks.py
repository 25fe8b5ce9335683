"""Background tasks of the gateway's parts: stopping them is one thing, done one way."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel ``tasks`` and wait until each has finished (its own error, if any, is dropped:
    a part that is stopping has nothing left to do with it)."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


async def all_done(waiting: Iterable[Awaitable[Any]]) -> None:
    """Await every one (none is left unawaited, whatever fails); raise the first failure."""
    for result in await asyncio.gather(*waiting, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result
