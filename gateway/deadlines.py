"""Connection deadlines (connect timeouts, keep-alives, heartbeats) on one event-loop timer, as
a timing wheel: a deadline costs an entry in the set of its tick, not a TimerHandle with its
copied context and bound method (~300 bytes per connection, most of an idle one's). A deadline
runs up to one tick late (``TICK_S``); one that is moved or cancelled is left in no set."""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
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
