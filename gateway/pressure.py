"""The store's resource alarm, as RabbitMQ raises its disk and memory alarms: publishers are
blocked while it is raised (AMQP ``connection.blocked``; MQTT publishers are paused).

Two conditions raise it: free space on the data directory's disk below ``disk_free_limit``
(a full disk would fail every put), and the store's backlog -- messages submitted and not
yet durable -- above ``backlog_limit`` (the writer cannot keep up; accepting more only grows
memory). The backlog condition clears at half its limit so the alarm does not flap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from store import MessageStore

log = logging.getLogger("tidemq.pressure")


class StorePressure:
    def __init__(self, store: MessageStore, *, disk_free_limit: int, backlog_limit: int) -> None:
        self.store = store
        self.disk_free_limit = disk_free_limit
        self.backlog_limit = backlog_limit
        self.reason: str | None = None
        self._listeners: list[Callable[[str | None], None]] = []

    @property
    def raised(self) -> bool:
        return self.reason is not None

    def on_change(self, listener: Callable[[str | None], None]) -> None:
        """Call ``listener(reason)`` when the alarm is raised (a reason) or cleared (None)."""
        self._listeners.append(listener)

    async def watch(self, interval_s: float = 0.2) -> None:
        """Check every ``interval_s`` until cancelled, telling the listeners of each change."""
        while True:
            if self.check():
                for listener in list(self._listeners):
                    try:
                        listener(self.reason)
                    except Exception:
                        log.exception("resource alarm listener failed")
            await asyncio.sleep(interval_s)

    def check(self) -> bool:
        """Re-evaluate; True when the alarm was raised or cleared by this check."""
        reason = self._reason()
        if reason == self.reason:
            return False
        if reason is None:
            log.info("resource alarm cleared was=%r", self.reason)
        else:
            log.warning("resource alarm raised reason=%r", reason)
        self.reason = reason
        return True

    def _reason(self) -> str | None:
        if self.disk_free_limit > 0:
            try:
                free = self.store.disk_free_bytes()
            except OSError as exc:
                log.warning("disk space check failed error=%s", exc)
            else:
                if free < self.disk_free_limit:
                    return f"low on disk: {free} bytes free, limit {self.disk_free_limit}"
        if self.backlog_limit > 0:
            backlog = self.store.backlog
            threshold = self.backlog_limit // 2 if self.reason and self.reason.startswith("store") else self.backlog_limit
            if backlog > threshold:
                return f"store backlog: {backlog} messages not yet written"
        return None
