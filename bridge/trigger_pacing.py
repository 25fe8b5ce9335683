"""``minOffsetsPerTrigger`` and ``maxTriggerDelay`` with the Kafka source's semantics: a trigger
with fewer new offsets than the minimum is skipped (``latestOffset`` answers the start, so Spark
runs no batch), unless ``maxTriggerDelay`` has passed since the last batch was let through. As in
Kafka, the clock starts at nothing, so a query's first trigger is never delayed, and a restarted
query starts it afresh. Under ``Trigger.AvailableNow`` nothing is delayed: what is left up to the
query's target is all there will be.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("tidemq.spark")


class TriggerPacer:
    def __init__(self, min_rows: int, max_delay_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.min_rows = min_rows
        self.max_delay_s = max_delay_s
        self._clock = clock
        self._last: float | None = None  # when a batch was last let through

    def admit(self, available: int) -> bool:
        """Whether a batch of ``available`` new offsets runs now."""
        now = self._clock()
        if self._last is not None and now - self._last < self.max_delay_s and available < self.min_rows:
            log.debug("tidemq source: delaying the batch available=%d minOffsetsPerTrigger=%d waited_s=%.1f",
                      available, self.min_rows, now - self._last)
            return False
        self._last = now
        return True
