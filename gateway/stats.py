"""Counters every protocol gateway keeps (plain ints on the hot path); the MQTT gateway also
publishes them under $SYS, and the metrics endpoint reads them when scraped."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ProtocolStats:
    messages_received: int = 0  # publishes / sends accepted from clients
    messages_sent: int = 0  # deliveries / pulled messages handed to clients
    bytes_received: int = 0
    bytes_sent: int = 0
    publish_dropped: int = 0  # MQTT: QoS 0 skipped for slow consumers, oversize for a client's limit
    connections_total: int = 0  # accepted since start
    auth_failures: int = 0  # logins refused
