"""Connection deadlines (connect timeouts, keep-alives, heartbeats) on one event-loop timer, as
a timing wheel: a deadline costs an entry in the set of its tick, not a TimerHandle with its
copied context and bound method (~300 bytes per connection, most of an idle one's). A deadline
runs up to one tick late (``TICK_S``); one that is moved or cancelled is left in no set.
``StalledReads`` closes connections that stop sending in the middle of a frame."""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from typing import Protocol

log = logging.getLogger("tidemq.deadlines")

TICK_S = 0.1  # how late a deadline may run; the timer wakes at most this often, and only when one is due


class Timed(Protocol):
    def deadline_reached(self) -> None:
        """Its deadline came (it may set a new one)."""


Slot = set  # what ``at`` returns: the set of the deadline's tick, to give ``cancel``


class Deadlines:
    __slots__ = ("_handle", "_slots", "_ticks")

    def __init__(self) -> None:
        self._slots: dict[int, set[Timed]] = {}  # tick -> who is due then
        self._ticks: list[int] = []  # the ticks of ``_slots``, a heap
        self._handle: asyncio.TimerHandle | None = None  # for the earliest tick

    def at(self, when: float, owner: Timed) -> Slot:
        """``owner.deadline_reached()`` at loop time ``when`` (or up to a tick later)."""
        tick = math.ceil(when / TICK_S)
        slot = self._slots.get(tick)
        if slot is None:
            slot = self._slots[tick] = set()
            heapq.heappush(self._ticks, tick)
            if self._ticks[0] == tick:
                self._wake_at(tick)
        slot.add(owner)
        return slot

    def later(self, delay: float, owner: Timed) -> Slot:
        return self.at(asyncio.get_running_loop().time() + delay, owner)

    @staticmethod
    def cancel(slot: Slot | None, owner: Timed) -> None:
        if slot is not None:
            slot.discard(owner)
            if not slot:
                slot.clear()  # (a set keeps its table when emptied one by one: clear frees it)

    def _wake_at(self, tick: int) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = asyncio.get_running_loop().call_at(tick * TICK_S, self._run)

    def _run(self) -> None:
        self._handle = None
        now = asyncio.get_running_loop().time()
        ticks = self._ticks
        while ticks and ticks[0] * TICK_S <= now:
            slot = self._slots.pop(heapq.heappop(ticks))
            for owner in tuple(slot):  # (a copy: one owner's deadline may cancel another's)
                if owner not in slot:
                    continue
                slot.discard(owner)
                try:
                    owner.deadline_reached()
                except Exception:  # one owner's failure must not stop the others' deadlines
                    log.exception("deadline failed owner=%r", owner)
        if ticks:
            self._wake_at(ticks[0])

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._slots.clear()
        self._ticks.clear()


class Reading(Protocol):
    def stalled_since(self) -> float | None:
        """``time.monotonic()`` of its last bytes while a frame is unfinished (now, while it is
        not read from); None when no frame is unfinished."""

    def read_timed_out(self) -> None:
        """No byte of its unfinished frame came for the read timeout: close it."""


class StalledReads:
    """Connections that stopped in the middle of a frame: watched from a read that leaves one
    unfinished, closed once no byte came for ``timeout_s`` (a sweep every half of it: within
    1.5 times). Whole-frame idleness is the protocol's keep-alive, heartbeat or idle timeout."""

    __slots__ = ("_handle", "_watched", "timeout_s")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._watched: set[Reading] = set()
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, conn: Reading) -> None:
        """``conn`` read part of a frame (cheap to repeat: a set's add)."""
        self._watched.add(conn)
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.timeout_s / 2, self._sweep)

    def forget(self, conn: Reading) -> None:
        self._watched.discard(conn)

    def _sweep(self) -> None:
        self._handle = None
        now = time.monotonic()
        for conn in tuple(self._watched):
            since = conn.stalled_since()
            if since is None:
                self._watched.discard(conn)
            elif now - since >= self.timeout_s:
                self._watched.discard(conn)
                try:
                    conn.read_timed_out()
                except Exception:  # one connection's failure must not spare the others
                    log.exception("read timeout failed conn=%r", conn)
        if self._watched:
            self._handle = asyncio.get_running_loop().call_later(self.timeout_s / 2, self._sweep)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._watched.clear()
