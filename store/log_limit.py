"""Rate-limited logging for events that can repeat thousands of times a second (failed
handshakes, commits failing on a full disk): one line per cause per interval, with a count.

It lives in the store, the lowest layer, so that the store and the gateway share it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

OTHER = "other"  # the cause of events beyond max_causes distinct ones


@dataclass(slots=True)
class _Window:
    until: float  # monotonic time the interval ends
    level: int
    message: str
    args: tuple[Any, ...]
    suppressed: int = 0  # events since the line that opened the window
    summary: asyncio.TimerHandle | None = None


class RateLimitedLog:
    """``log(level, cause, msg, *args)``: the first event of a cause is logged at once
    (``count=1``); the ones after it within ``interval_s`` are counted, and one line with their
    ``count`` closes the interval (from the event loop's timer, or with the next event of the
    cause when no loop runs). Causes are short, low-cardinality names (an exception type, an
    errno), never a peer address; at most ``max_causes`` are tracked, beyond that they share
    one window named ``other``."""

    def __init__(self, logger: logging.Logger | logging.LoggerAdapter, interval_s: float = 60.0,
                 max_causes: int = 256) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.max_causes = max_causes
        self._windows: dict[str, _Window] = {}

    def log(self, level: int, cause: str, msg: str, *args: Any, exc_info: Any = None) -> bool:
        """Log or count one event; True when a line was written now. ``exc_info`` (a traceback)
        is written with the first line of an interval only."""
        now = time.monotonic()
        window = self._windows.get(cause)
        if window is not None and now >= window.until:
            self._close(cause)
            window = None
        if window is None:
            if len(self._windows) >= self.max_causes:
                self._expire(now)
                if len(self._windows) >= self.max_causes:
                    cause = OTHER
                    window = self._windows.get(OTHER)
            if window is None:
                self._windows[cause] = _Window(now + self.interval_s, level, msg, args)
                self.logger.log(level, msg + " cause=%s count=1", *args, _value(cause), exc_info=exc_info)
                return True
        window.suppressed += 1
        window.level, window.message, window.args = max(window.level, level), msg, args
        if window.summary is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return False  # no loop: the next event of this cause writes the count
            window.summary = loop.call_at(loop.time() + max(0.0, window.until - now), self._close, cause)
        return False

    def _close(self, cause: str) -> None:
        window = self._windows.pop(cause, None)
        if window is None:
            return
        if window.summary is not None:
            window.summary.cancel()
        if window.suppressed:
            self.logger.log(window.level, window.message + " cause=%s count=%d interval_s=%g", *window.args,
                            _value(cause), window.suppressed, self.interval_s)

    def _expire(self, now: float) -> None:
        for cause in [c for c, w in self._windows.items() if now >= w.until]:
            self._close(cause)

    def flush(self) -> None:
        """Write the counts of every open interval now (at shutdown)."""
        for cause in list(self._windows):
            self._close(cause)


def _value(text: str) -> str:
    """A key=value value: quoted (logfmt) when it has spaces or quotes."""
    if text and not any(c in text for c in ' "='):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
