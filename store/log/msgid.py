"""Message ids in RocketMQ's offsetMsgId form: store IPv4 (4 bytes) + port (4) + commitlog position (8), hex."""

from __future__ import annotations

import ipaddress
import struct

_ID = struct.Struct(">4sIQ")


def make_store_identity(host: str, port: int) -> bytes:
    """The 8 bytes that name a store in every message id it hands out."""
    try:
        packed = ipaddress.IPv4Address(host).packed
    except ipaddress.AddressValueError:
        raise ValueError(f"store identity needs an IPv4 address, got {host!r}") from None
    return packed + struct.pack(">I", port)


def encode_msg_id(identity: bytes, position: int) -> str:
    return f"{identity.hex().upper()}{position:016X}"


def msg_id_prefix(identity: bytes) -> str:
    """The constant first half of every id of one store: ``prefix + f"{position:016X}"``."""
    return identity.hex().upper()


def decode_msg_id(msg_id: str) -> tuple[str, int, int]:
    """Return (host, port, commitlog position); raise ValueError for anything but a 32-hex-digit id."""
    if len(msg_id) != 32:
        raise ValueError("message id must be 32 hex digits")
    raw = bytes.fromhex(msg_id)
    ip, port, position = _ID.unpack(raw)
    return str(ipaddress.IPv4Address(ip)), port, position
