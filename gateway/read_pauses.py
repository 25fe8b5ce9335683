"""Why a connection is not being read from. Several reasons can hold a connection at once
(authentication in progress, too many puts on their way to the store, the store's resource
alarm); reading resumes only when the last one is gone."""

from __future__ import annotations

import asyncio

# Reading, not paused: one shared empty set for every connection (a set costs 216 bytes even
# empty, and a connection is read from nearly all its life); a pause makes its own set.
_READING: frozenset[str] = frozenset()


class ReadPauses:
    __slots__ = ("reasons", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.ReadTransport | None = None
        self.reasons: set[str] | frozenset[str] = _READING

    def pause(self, why: str) -> None:
        if isinstance(self.reasons, set):  # (paused: a set of its own is never empty)
            self.reasons.add(why)
            return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self.reasons = {why}

    def resume(self, why: str) -> None:
        reasons = self.reasons
        if why not in reasons:
            return
        assert isinstance(reasons, set)  # (only a pause's own set holds a reason)
        reasons.discard(why)
        if not reasons:
            self.reasons = _READING
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def __contains__(self, why: str) -> bool:
        return why in self.reasons
