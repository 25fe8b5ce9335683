"""Bytes <-> packets for MQTT 3.1, 3.1.1 and 5.0 (sans-IO): the writer (``encode``) and the
reader (``PacketReader``) under one name, for callers that use both (clients, tests)."""

from .reader import PacketReader, decode
from .writer import PROTOCOL_NAMES, PublishTemplate, encode, fixed_header

__all__ = ["PROTOCOL_NAMES", "PacketReader", "PublishTemplate", "decode", "encode", "fixed_header"]
