"""A gateway node's writes to its store node through a failover (the store node restarts, a
replicated store's leader dies): a write that failed because the store node was not reached,
or said "not now", is sent again -- on the next link as soon as it is made, ahead of anything
else, or after ``RETRY_S`` on this one -- until ``failover_s`` after it was first sent.

Writes keep the order they were first sent in: while some wait to be sent again, a new one waits
behind them. Writes of one key (a session, a retained topic) are values, the newest wins: an
older one still waiting, or failing after a newer one was sent, is dropped for it and answered
as the newer one is. A write whose answer the lost link never brought may have been done: it is
sent again (at least once).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from store import StoreError

from .remote_store import RemoteStore, RemoteStoreError

T = TypeVar("T")

RETRY_S = 0.2  # a write the (new) store node answered "not now" is sent again after this


class FailoverWrites:
    """``remote()``: the store link now; ``linked()``: whether it is up; ``failover_s()``: how
    long a write may wait. ``send_waiting()`` on each new link; ``refuse()`` when the node gives
    up on the store node (its clients are dropped), ``refusing = False`` when linked again."""

    def __init__(self, remote: Callable[[], RemoteStore], linked: Callable[[], bool],
                 failover_s: Callable[[], float]) -> None:
        self._remote = remote
        self._linked = linked
        self._failover_s = failover_s
        self._waiting: list[_Write] = []  # writes to send again, in first-send order
        self._seq = itertools.count()
        self._newest: dict[Hashable, _Write] = {}  # key -> its newest write not yet answered
        self._resend: asyncio.TimerHandle | None = None  # the waiting writes go again on this link
        self.refusing = False  # no store node for failover_s: writes fail at once
        self._closed = False

    def send(self, send: Callable[[RemoteStore], Awaitable[T]], key: Hashable | None = None) -> asyncio.Future[T]:
        out: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if self.refusing:  # (no store node for failover_s: the clients were dropped)
            out.set_exception(RemoteStoreError("no store node", retryable=True))
            return out
        write = _Write(next(self._seq), send, out, time.monotonic() + self._failover_s(), key)
        if key is not None:
            self._newest[key] = write
            for older in [w for w in self._waiting if w.key == key]:
                self._waiting.remove(older)
                _answer_as(older, write)
        if self._waiting:
            self._wait(write)
        else:
            self._send(write)
        return out

    def send_waiting(self) -> None:
        """What waited, in order (on a new link, or again on this one); what waited too long fails."""
        if self._resend is not None:
            self._resend.cancel()
            self._resend = None
        self.expire()
        waiting, self._waiting = self._waiting, []
        for write in waiting:
            self._send(write)

    def expire(self, everything: bool = False) -> None:
        """Fail the waiting writes past their time (``everything``: all of them)."""
        now = time.monotonic()
        kept = []
        for write in self._waiting:
            if write.out.done():
                continue
            if everything or now >= write.deadline:
                write.out.set_exception(write.error or RemoteStoreError("no store node", retryable=True))
            else:
                kept.append(write)
        self._waiting = kept

    def refuse(self) -> None:
        """The node gave up on the store node: what waits is not sent later (its clients never had
        its answer, and may be on another node by then, with newer sessions), nor what comes."""
        self.refusing = True
        self.expire(everything=True)

    def close(self, error: StoreError) -> None:
        self._closed = True
        for write in self._waiting:
            if not write.out.done():
                write.out.set_exception(error)
        self._waiting = []

    def _send(self, write: _Write) -> None:
        asyncio.ensure_future(write.send(self._remote())).add_done_callback(lambda f: self._sent(write, f))

    def _sent(self, write: _Write, f: asyncio.Future[Any]) -> None:
        out = write.out
        if write.key is not None and self._newest.get(write.key) is write and (
                f.cancelled() or f.exception() is None or not self._may_retry(write, f.exception())):
            del self._newest[write.key]
        if out.done():
            return
        if f.cancelled():
            out.cancel()
            return
        exc = f.exception()
        if exc is None:
            out.set_result(f.result())
        elif not self._may_retry(write, exc):
            out.set_exception(exc)
        else:
            assert isinstance(exc, RemoteStoreError)
            write.error = exc
            newer = self._newest.get(write.key) if write.key is not None else None
            if newer is not None and newer is not write:  # a newer value of its key was sent since
                _answer_as(write, newer)
                return
            self._wait(write)

    def _may_retry(self, write: _Write, exc: BaseException | None) -> bool:
        return isinstance(exc, RemoteStoreError) and exc.retryable and not self._closed and not self.refusing \
            and time.monotonic() < write.deadline

    def _wait(self, write: _Write) -> None:
        """Wait to be sent again, in first-send order: after RETRY_S on this link when it is up
        (the store node said "not now"), else on the next link."""
        bisect.insort(self._waiting, write, key=lambda w: w.seq)
        if self._resend is None and self._linked():
            self._resend = asyncio.get_running_loop().call_later(RETRY_S, self.send_waiting)


@dataclass(slots=True)
class _Write:
    seq: int  # the order it was first sent in
    send: Callable[[RemoteStore], Awaitable[Any]]
    out: asyncio.Future[Any]
    deadline: float
    key: Hashable | None = None
    error: RemoteStoreError | None = None


def _answer_as(older: _Write, newer: _Write) -> None:
    """``older`` is answered as ``newer`` will be (a newer value of the same key replaced it)."""
    def copy(done: asyncio.Future[Any]) -> None:
        if older.out.done():
            return
        if done.cancelled():
            older.out.cancel()
        elif (exc := done.exception()) is not None:
            older.out.set_exception(exc)
        else:
            older.out.set_result(done.result())
    newer.out.add_done_callback(copy)
