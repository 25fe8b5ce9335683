"""store.log_limit.RateLimitedLog: one line per cause per interval, then one with the count."""

from __future__ import annotations

import asyncio
import logging

from store.log_limit import RateLimitedLog


async def test_one_line_per_cause_then_the_count(caplog) -> None:
    logger = logging.getLogger("tidemq.test.limit")
    caplog.set_level(logging.INFO, logger="tidemq.test.limit")
    limited = RateLimitedLog(logger, interval_s=0.2, max_causes=2)
    for i in range(10):
        limited.log(logging.WARNING, "disk full", "commit failed n=%d", i)
    limited.log(logging.INFO, "eof", "closed early")
    limited.log(logging.INFO, "third", "beyond max_causes")  # shares the window "other"
    limited.log(logging.INFO, "fourth", "beyond max_causes")
    assert [r.getMessage() for r in caplog.records] == [
        'commit failed n=0 cause="disk full" count=1', "closed early cause=eof count=1",
        "beyond max_causes cause=other count=1"]
    await asyncio.sleep(0.4)  # the intervals end: counts of what was held back, from the loop's timer
    assert [r.getMessage() for r in caplog.records][3:] == [
        'commit failed n=9 cause="disk full" count=9 interval_s=0.2', "beyond max_causes cause=other count=1 interval_s=0.2"]
    assert caplog.records[3].levelno == logging.WARNING
    limited.log(logging.WARNING, "disk full", "commit failed n=%d", 10)  # a new interval
    assert caplog.records[-1].getMessage() == 'commit failed n=10 cause="disk full" count=1'
