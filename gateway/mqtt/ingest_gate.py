"""Fair turns between reading MQTT publishers and pumping MQTT subscribers on one node.

One loop turn reads up to 256 KiB from every readable publisher (4 publishers of 64-byte
messages: some 14,000 messages), far more than a QoS 0 subscriber's bound
(``mqtt_max_queued_messages``). So a QoS 0 subscriber that still has messages to send while
its socket is full *waits*, and while any subscriber waits the node's MQTT publishers are not
read (what they sent waits in their sockets, in order): the loop's turns go to delivery until
the subscriber has caught up. Its connection tells when it stalls (its socket did not drain
within ``subscriber_stall_s``): a stalled subscriber holds nobody and has its QoS 0 backlog cut.
Only this node's MQTT publishers are held: what AMQP, remoting or other nodes publish reaches a
subscriber that keeps up later (its backlog waits in the store), never cut.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .connection import MQTTConnection

log = logging.getLogger("tidemq.mqtt")


class IngestGate:
    __slots__ = ("held", "waiting")

    def __init__(self) -> None:
        self.waiting: set[object] = set()  # subscribers with a QoS 0 backlog and a full socket
        self.held: set[MQTTConnection] = set()  # publishers not read until ``waiting`` is empty

    @property
    def shut(self) -> bool:
        return bool(self.waiting)

    def wait(self, subscriber: object) -> None:
        self.waiting.add(subscriber)

    def done(self, subscriber: object) -> None:
        """``subscriber`` caught up, stalled or left; the last one out lets the publishers in."""
        if subscriber in self.waiting:
            self.waiting.discard(subscriber)
            if not self.waiting:
                self._release()

    def hold(self, publisher: MQTTConnection) -> None:
        self.held.add(publisher)

    def forget(self, conn: object) -> None:
        """A connection closed: neither held nor waited for."""
        self.held.discard(conn)
        self.done(conn)

    def _release(self) -> None:
        held, self.held = self.held, set()
        for publisher in held:
            try:
                publisher.ingest_open()
            except Exception:  # one publisher's failure must not keep the others held
                log.exception("publisher not resumed publisher=%r", publisher)
