"""Errors of the remoting codec: what a peer sent is not valid remoting. Each carries the
response code a broker answers with when the request can still be answered; a frame-level
error (bad lengths, unparsable header) leaves the stream unusable and closes the connection."""

from __future__ import annotations

from .codes import ResponseCode


class RemotingProtocolError(ValueError):
    """Base of every error decoding raises; nothing else escapes the codec's decoders."""

    # RocketMQ answers a request it cannot decode (RemotingCommandException) with SYSTEM_ERROR
    response_code: int = ResponseCode.SYSTEM_ERROR


class FrameTooLarge(RemotingProtocolError):
    """A frame whose length prefix exceeds the reader's limit; refused before it is buffered."""


class HeaderError(RemotingProtocolError):
    """A request header field (``extFields``) that is missing or not of its type. The frame was
    fine: the request gets an error response and the connection stays."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class SqlParseError(RemotingProtocolError):
    """A SQL92 subscription expression that does not parse, or that RocketMQ's filter refuses
    to build (the message says where and why)."""

    response_code = ResponseCode.SUBSCRIPTION_PARSE_FAILED
