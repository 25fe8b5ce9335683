"""Errors of MQTT, as h11 has them: the peer broke the protocol (``RemoteProtocolError``, which
carries the MQTT 5.0 reason code to answer with), or we were asked to send something the
protocol forbids in this state (``LocalProtocolError``, a bug on our side)."""

from __future__ import annotations

from .reason_codes import ReasonCode


class RemoteProtocolError(Exception):
    """The peer broke the protocol; the base of every error decoding raises (nothing else
    escapes it). ``reason_code`` is what the DISCONNECT (or refusing CONNACK) says."""

    reason_code: ReasonCode = ReasonCode.UNSPECIFIED_ERROR

    def __init__(self, message: str, reason_code: ReasonCode | None = None) -> None:
        super().__init__(message)
        if reason_code is not None:
            self.reason_code = reason_code


MQTTError = RemoteProtocolError  # the name the codec's callers know


class LocalProtocolError(Exception):
    """We were asked to send a packet the connection's state forbids (a bug of the caller)."""


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
