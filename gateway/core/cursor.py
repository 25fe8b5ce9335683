# cython: annotation_typing=False
"""A reader's place in one queue: the next offset to pull and the offsets handed out but not yet
settled. Its committed offset -- the oldest unsettled one, or the next to pull -- is where a
restart resumes. One pull loop for every protocol: a read that finds the reader's offset gone
(retention removed it) or past the queue's end (the store was replaced or cut) moves the cursor
to where the store says and goes on, reporting the move.

Compiled by Cython (pyproject.toml ``[tool.tidemq] compiled``): ``Cursor`` is an extension type
whose ``next_offset`` is a C integer; the same file runs interpreted with ``TIDEMQ_PURE_PYTHON=1``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import cython

from store import GetResult, GetStatus

if TYPE_CHECKING:
    from cache import QueueCache

_FOUND = cython.declare(object, GetStatus.FOUND)
_TOO_SMALL = cython.declare(object, GetStatus.OFFSET_TOO_SMALL)
_OVERFLOW = cython.declare(object, GetStatus.OFFSET_OVERFLOW)


Moved = Callable[["Cursor", int, int], None]  # (cursor, from offset, to offset)


@cython.cclass
class Cursor:
    """``unacked`` maps each offset handed out and not settled to what the reader keeps with it
    (a packet id, a member); offsets enter it in increasing order, so its first key is the oldest."""

    if cython.compiled:
        queue = cython.declare(object, visibility="public")
        next_offset = cython.declare(cython.longlong, visibility="public")
        unacked = cython.declare(dict, visibility="public")
    else:
        __slots__ = ("next_offset", "queue", "unacked")

    def __init__(self, queue: str, next_offset: int, unacked: dict[int, object] | None = None) -> None:
        self.queue = queue
        self.next_offset = next_offset
        self.unacked: dict[int, object] = (  # type: ignore[no-redef]  # (declared for Cython)
            unacked if unacked is not None else {})

    @property
    def committed(self) -> int:
        for offset in self.unacked:  # the oldest
            return min(offset, self.next_offset)
        return self.next_offset

    def read(self, source: QueueCache, max_messages: int, moved: Moved | None = None) -> GetResult | None:
        """The messages from ``next_offset`` on (a FOUND result), or None when there is nothing
        new. The cursor does not advance: the reader moves ``next_offset`` past what it takes."""
        while True:
            result = source.read(self.queue, self.next_offset, max_messages)
            status = result.status
            if status is _FOUND:
                return result
            if status is _TOO_SMALL or status is _OVERFLOW:
                if moved is not None:
                    moved(self, self.next_offset, result.next_offset)
                self.next_offset = result.next_offset
                continue
            return None

    def __repr__(self) -> str:
        return f"Cursor({self.queue!r}, next_offset={self.next_offset}, unacked={len(self.unacked)})"
