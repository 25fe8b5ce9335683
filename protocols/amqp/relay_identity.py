"""How a relayed AMQP connection names its publishes so that a failover does not store one twice.

A gateway node's relay (``relay_memory``) says in the client properties of the connection it
opens for a client, ``x-tidemq-relay: TOKEN.GENERATION``, who it is: TOKEN for the client's
connection, GENERATION counting the servers it was opened on (0, then 1 after a failover...).
A server numbers each publish of a confirm-mode channel of such a connection with its delivery
confirmation's sequence number, as producer ``TOKEN.GENERATION:CHANNEL``. After a failover the
relay publishes again what was not confirmed, each with the header ``x-tidemq-origin:
GENERATION:SEQUENCE`` of its first publish: the new server stores it under that number, so a
message the old server had stored (and replicated) is confirmed, not stored again. The header
is removed before the message is stored.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from .frames import ContentReceived

RELAY_PROPERTY = "x-tidemq-relay"
ORIGIN_HEADER = "x-tidemq-origin"
ORIGIN_BYTES = ORIGIN_HEADER.encode()  # (looked for in encoded properties before decoding them)

_IDENTITY = re.compile(r"([0-9a-f]{8,32})\.([0-9]{1,9})")
_ORIGIN = re.compile(r"([0-9]{1,9}):([0-9]{1,18})")


def relay_identity(client_properties: dict[str, Any] | None) -> tuple[str, int] | None:
    """(token, generation) of a relayed connection; None for any other (or a malformed claim)."""
    value = (client_properties or {}).get(RELAY_PROPERTY)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    found = _IDENTITY.fullmatch(value) if isinstance(value, str) else None
    return (found.group(1), int(found.group(2))) if found else None


def identity_value(token: str, generation: int) -> str:
    return f"{token}.{generation}"


def origin_of(headers: dict[str, Any] | None) -> tuple[int, int] | None:
    """(generation, sequence) of a publish sent again; None when it is not one."""
    value = (headers or {}).get(ORIGIN_HEADER)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    found = _ORIGIN.fullmatch(value) if isinstance(value, str) else None
    return (int(found.group(1)), int(found.group(2))) if found else None


def origin_value(generation: int, sequence: int) -> str:
    return f"{generation}:{sequence}"


def producer(token: str, generation: int, channel: int) -> bytes:
    """The store's producer id of a relayed channel's publishes (store/write/idempotence.py)."""
    return f"{token}.{generation}:{channel}".encode()


def without_origin(event: ContentReceived) -> tuple[ContentReceived, tuple[int, int] | None]:
    """A publish with its ``x-tidemq-origin`` header taken out, and the origin it named (the
    event as it is, and None, when it has none: looked for in its encoded properties first)."""
    if ORIGIN_BYTES not in event.raw_properties:
        return event, None
    properties = copy.copy(event.properties)
    headers = dict(properties.headers or {})
    origin = origin_of(headers)
    headers.pop(ORIGIN_HEADER, None)
    properties.headers = headers or None
    return ContentReceived(event.channel, event.method, event.body, None, properties, event.delivery_mode,
                           event.message_id), origin
