"""Why a connection is not being read from. Several reasons can hold a connection at once
(authentication in progress, too many puts on their way to the store, the store's resource
alarm); reading resumes only when the last one is gone."""

from __future__ import annotations

import asyncio


class ReadPauses:
    __slots__ = ("reasons", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.ReadTransport | None = None
        self.reasons: set[str] = set()

    def pause(self, why: str) -> None:
        if not self.reasons and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self.reasons.add(why)

    def resume(self, why: str) -> None:
        if why not in self.reasons:
            return
        self.reasons.discard(why)
        if not self.reasons and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def __contains__(self, why: str) -> bool:
        return why in self.reasons
