"""Retention: which whole commitlog segments may go, by age and by total size.

The newest (active) segment always stays. Segments go oldest first, so the log keeps
one contiguous range of positions.
"""

from __future__ import annotations

import os
from typing import Sequence

from .commitlog import Segment


class RetentionPolicy:
    def __init__(self, max_age_hours: float, max_bytes: int) -> None:
        self.max_age_seconds = max_age_hours * 3600.0
        self.max_bytes = max_bytes

    @property
    def enabled(self) -> bool:
        return self.max_age_seconds > 0 or self.max_bytes > 0

    def segments_to_delete(self, segments: Sequence[Segment], now: float) -> list[Segment]:
        old = list(segments[:-1])  # never the active one
        doomed: list[Segment] = []
        if self.max_age_seconds > 0:
            # A segment's mtime is the time of its newest record.
            while old and now - os.fstat(old[0].fd).st_mtime > self.max_age_seconds:
                doomed.append(old.pop(0))
        if self.max_bytes > 0:
            total = sum(s.length for s in segments) - sum(s.length for s in doomed)
            while old and total > self.max_bytes:
                seg = old.pop(0)
                total -= seg.length
                doomed.append(seg)
        return doomed
