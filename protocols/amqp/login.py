"""AMQP 0-9-1 SASL login responses without I/O: the mechanisms the server offers in
connection.start and the (user, password) a client's connection.start-ok response carries
(no user for ANONYMOUS, RFC 4505: its response, a trace token, is no credential)."""

from __future__ import annotations

import struct

from pamqp import decode

# PLAIN (RFC 4616) and AMQPLAIN (RabbitMQ's; py-amqp and kombu use it by default)
MECHANISMS = "PLAIN AMQPLAIN"
ANONYMOUS = "ANONYMOUS"


def mechanisms(anonymous: bool) -> str:
    """What connection.start offers: ANONYMOUS too when anonymous clients are allowed."""
    return f"{MECHANISMS} {ANONYMOUS}" if anonymous else MECHANISMS


def _raw(response: str | bytes | None) -> bytes:
    if response is None:
        return b""
    # pamqp hands the long string over as text (latin-1 keeps every byte as it came)
    return response.encode("latin-1", "replace") if isinstance(response, str) else bytes(response)


def parse_login(mechanism: str, response: str | bytes | None) -> tuple[str | None, bytes] | None:
    """The (user, password) of a start-ok response ((None, b"") for ANONYMOUS), or None when
    it cannot be read."""
    if mechanism == ANONYMOUS:
        return None, b""
    raw = _raw(response)
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            return None
        return parts[1].decode("utf-8", "replace"), parts[2]
    if mechanism == "AMQPLAIN":
        # a field table without its length prefix: LOGIN and PASSWORD
        try:
            _, table = decode.field_table(struct.pack(">I", len(raw)) + raw)
        except Exception:  # pamqp raises what its decoders raise on garbage
            return None
        user, password = table.get("LOGIN"), table.get("PASSWORD")
        if not isinstance(user, (str, bytes)) or not isinstance(password, (str, bytes)):
            return None
        user = user.decode("utf-8", "replace") if isinstance(user, bytes) else user
        return user, password.encode() if isinstance(password, str) else password
    return None


def secret_bytes(secret: str | bytes | None) -> bytes:
    """connection.update-secret's new secret, as the password to check."""
    return _raw(secret)
