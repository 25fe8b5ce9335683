"""MQTT control packets as plain dataclasses (no I/O, no encoding: see codec.py).

Fields cover both versions; MQTT 3.1.1 ignores reason codes and properties. ``version`` is
the protocol level: 3 (3.1), 4 (3.1.1) or 5 (5.0).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .properties import Properties

MQTT_3_1 = 3
MQTT_3_1_1 = 4
MQTT_5 = 5


class PacketType(enum.IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = field(default_factory=Properties)


@dataclass(slots=True)
class Connect:
    client_id: str
    version: int = MQTT_3_1_1
    clean_start: bool = True  # "clean session" in 3.1.1
    keep_alive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.CONNECT


@dataclass(slots=True)
class ConnAck:
    session_present: bool = False
    reason_code: int = 0  # a 5.0 reason code; the codec maps it to a 3.1.1 return code
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.CONNACK


@dataclass(slots=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.PUBLISH


@dataclass(slots=True)
class PubAck:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.PUBACK


@dataclass(slots=True)
class PubRec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.PUBREC


@dataclass(slots=True)
class PubRel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.PUBREL


@dataclass(slots=True)
class PubComp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.PUBCOMP


class RetainHandling(enum.IntEnum):
    SEND_ON_SUBSCRIBE = 0
    SEND_IF_NEW_SUBSCRIPTION = 1
    DO_NOT_SEND = 2


@dataclass(slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE with its options (5.0 section 3.8.3.1)."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = RetainHandling.SEND_ON_SUBSCRIBE


@dataclass(slots=True)
class Subscribe:
    packet_id: int
    subscriptions: list[Subscription]
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.SUBSCRIBE


@dataclass(slots=True)
class SubAck:
    packet_id: int
    reason_codes: list[int]  # granted QoS 0-2 or a failure code (3.1.1: 0x80)
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.SUBACK


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: list[str]
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.UNSUBSCRIBE


@dataclass(slots=True)
class UnsubAck:
    packet_id: int
    reason_codes: list[int] = field(default_factory=list)  # 5.0 only
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.UNSUBACK


@dataclass(slots=True)
class PingReq:
    packet_type = PacketType.PINGREQ


@dataclass(slots=True)
class PingResp:
    packet_type = PacketType.PINGRESP


@dataclass(slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.DISCONNECT


@dataclass(slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = field(default_factory=Properties)
    packet_type = PacketType.AUTH


Packet = (Connect | ConnAck | Publish | PubAck | PubRec | PubRel | PubComp | Subscribe | SubAck
          | Unsubscribe | UnsubAck | PingReq | PingResp | Disconnect | Auth)
