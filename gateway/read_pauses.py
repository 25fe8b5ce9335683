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
        if not self.reasons:
            if self.transport is not None and not self.transport.is_closing():
                self.transport.pause_reading()
            self.reasons = {why}
        else:
            self.reasons.add(why)  # type: ignore[union-attr]

    def resume(self, why: str) -> None:
        if why not in self.reasons:
            return
        self.reasons.discard(why)  # type: ignore[union-attr]
        if not self.reasons:
            self.reasons = _READING
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    def __contains__(self, why: str) -> bool:
        return why in self.reasons
