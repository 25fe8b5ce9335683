"""The committer's wait for the in-sync replicas (``replication = "sync"``): a written batch is
published (indexed, announced, handed to tail readers) and acknowledged only once the group's
confirmed position covers it, so no reader and no client sees a message a failover could take
away (RocketMQ's confirm offset in controller mode, Kafka's high watermark).

Batches are released in the order they were written. One that waits longer than ``timeout_s``
is answered with NotReplicatedError but stays queued: its records are in the log, and it is
published in its turn once confirmed (a client told "not stored" may see its message later, as
with Kafka's and RocketMQ's timeouts). Likewise a batch confirmed while fewer than
``min_insync`` replicas are in sync (every in-sync replica holds it, so it is shown; too few
hold it to acknowledge it).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import NotReplicatedError, StoreError


@dataclass(slots=True)
class _Waiting:
    end: int | None  # the commitlog's end after the batch; None: the batch failed before writing
    entry: Any  # the committer's entry
    since: float = field(default_factory=time.monotonic)
    answered: bool = False


class ReplicatedRelease:
    """``wait`` queues a written batch; ``confirm`` releases those the confirmed position covers
    (``release(entry, None)``); ``expire`` answers those waiting too long (``release(entry,
    error)`` now, ``release(entry, None)`` later still publishes them without answering).
    ``confirmed``: how far writes may be acknowledged (held by ``min_insync`` replicas)."""

    def __init__(self, release: Callable[[Any, StoreError | None, bool], None], timeout_s: float) -> None:
        self._release = release
        self.timeout_s = timeout_s
        self.confirmed = 0
        self._waiting: deque[_Waiting] = deque()
        self._positions: list[tuple[int, asyncio.Future[None], float]] = []  # ``reached`` waiters, since when
        self.shown = 0  # what every in-sync replica holds, however many are in sync
        self._shown_waiters: list[tuple[int, asyncio.Future[None], float]] = []  # ``reached(shown=True)``

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def wait(self, end: int | None, entry: Any) -> None:
        self._waiting.append(_Waiting(end, entry))
        self.confirm(self.confirmed)

    def reached(self, position: int, shown: bool = False) -> asyncio.Future[None]:
        """Resolves once the confirmed position reaches ``position`` (what a meta change record
        ends at: its acknowledgement waits for it, as a put's does). ``shown``: once every
        in-sync replica holds it, however many are in sync (a reply that only shows state)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if position <= (self.shown if shown else self.confirmed):
            fut.set_result(None)
        else:
            (self._shown_waiters if shown else self._positions).append((position, fut, time.monotonic()))
        return fut

    def confirm(self, position: int, enough: bool = True) -> None:
        """Every in-sync replica holds up to ``position``; ``enough``: at least ``min_insync``
        replicas are in sync (else what it covers is shown, and answered NotReplicatedError)."""
        if enough:
            self.confirmed = max(self.confirmed, position)
        self.shown = max(self.shown, position)
        if self._shown_waiters:
            self._shown_waiters = _answer(self._shown_waiters, position, position)
        if self._positions:
            self._positions = _answer(self._positions, position, self.confirmed)
        waiting = self._waiting
        while waiting and (waiting[0].end is None or waiting[0].end <= position):
            item = waiting.popleft()
            if not item.answered and item.end is not None and item.end > self.confirmed:
                item.answered = True
                self._release(item.entry, _too_few(), False)
            self._release(item.entry, None, item.answered)

    def expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for waiters in (self._positions, self._shown_waiters):
            for _, fut, since in waiters:
                if now - since >= self.timeout_s and not fut.done():
                    fut.set_exception(NotReplicatedError(
                        f"not confirmed by the in-sync replicas within {self.timeout_s:g} s"))
        self._positions = [p for p in self._positions if not p[1].done()]
        self._shown_waiters = [p for p in self._shown_waiters if not p[1].done()]
        for item in self._waiting:
            if item.answered or now - item.since < self.timeout_s:
                continue
            item.answered = True
            self._release(item.entry, NotReplicatedError(
                f"not confirmed by the in-sync replicas within {self.timeout_s:g} s"), False)

    def abandon(self, error: StoreError) -> list[Any]:
        """Leadership is lost: answer everything waiting with ``error``; return the entries
        (their records are the new leader's to keep or cut)."""
        for _, fut, _ in (*self._positions, *self._shown_waiters):
            if not fut.done():
                fut.set_exception(error)
        self._positions = []
        self._shown_waiters = []
        entries = []
        while self._waiting:
            item = self._waiting.popleft()
            if not item.answered:
                self._release(item.entry, error, False)
            entries.append(item.entry)
        return entries


def _too_few() -> NotReplicatedError:
    return NotReplicatedError("fewer replicas than min_insync_replicas were in sync to hold it")


def _answer(waiters: list[tuple[int, asyncio.Future[None], float]], position: int, acknowledged: int
            ) -> list[tuple[int, asyncio.Future[None], float]]:
    """Resolve the ``reached`` waiters up to ``position``: reached if ``acknowledged`` covers
    them, else NotReplicatedError (too few in sync); those beyond it wait on."""
    still = []
    for at, fut, since in waiters:
        if at > position:
            still.append((at, fut, since))
        elif not fut.done():
            if at <= acknowledged:
                fut.set_result(None)
            else:
                fut.set_exception(_too_few())
    return still
