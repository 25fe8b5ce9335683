"""The wall clock in milliseconds since the epoch: the unit of store timestamps and due times."""

from __future__ import annotations

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000
