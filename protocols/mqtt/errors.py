"""Errors of the MQTT codec. Each carries the MQTT 5.0 reason code a server answers with."""

from __future__ import annotations

from .reason_codes import ReasonCode


class MQTTError(Exception):
    """Base of every error the codec raises; nothing else escapes decoding."""

    reason_code: ReasonCode = ReasonCode.UNSPECIFIED_ERROR

    def __init__(self, message: str, reason_code: ReasonCode | None = None) -> None:
        super().__init__(message)
        if reason_code is not None:
            self.reason_code = reason_code


class MalformedPacket(MQTTError):
    """Bytes that cannot be parsed per the spec (reason 0x81)."""

    reason_code = ReasonCode.MALFORMED_PACKET


class ProtocolViolation(MQTTError):
    """A well-formed packet that breaks a protocol rule (reason 0x82 unless said otherwise)."""

    reason_code = ReasonCode.PROTOCOL_ERROR


class PacketTooLarge(MQTTError):
    """A packet above the maximum packet size (reason 0x95)."""

    reason_code = ReasonCode.PACKET_TOO_LARGE


class UnsupportedProtocolVersion(MQTTError):
    """CONNECT with a protocol name/level we do not speak (5.0: 0x84; 3.1.1: return code 1)."""

    reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
