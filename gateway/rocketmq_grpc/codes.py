"""The gRPC status code of what the remoting side and the store refuse, in one place: the
specific code RocketMQ 5's clients interpret wherever the protocol has one."""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as pb

from protocols.remoting.codes import ResponseCode
from store import (
    InvalidMessageError,
    MessageTooLargeError,
    NotLeaderError,
    NotReplicatedError,
    StoreClosedError,
    StoreError,
)

_OF_REMOTING: dict[int, int] = {
    ResponseCode.NO_PERMISSION: pb.FORBIDDEN,
    ResponseCode.TOPIC_NOT_EXIST: pb.TOPIC_NOT_FOUND,
    ResponseCode.INVALID_PARAMETER: pb.BAD_REQUEST,
    # (what the remoting side refuses as MESSAGE_ILLEGAL once the topic name is valid: a
    # property -- an internal name, an mqttSecondTopic that makes no MQTT topic)
    ResponseCode.MESSAGE_ILLEGAL: pb.ILLEGAL_MESSAGE_PROPERTY_KEY,
}


def grpc_code_of_remoting(code: int) -> int:
    """The gRPC code of a remoting response code raised by the shared send and pop paths."""
    return _OF_REMOTING.get(code, pb.INTERNAL_ERROR)


def grpc_code_of_store_error(exc: StoreError) -> int:
    if isinstance(exc, MessageTooLargeError):
        return pb.MESSAGE_BODY_TOO_LARGE
    if isinstance(exc, InvalidMessageError):
        return pb.MESSAGE_CORRUPTED
    if isinstance(exc, (NotLeaderError, NotReplicatedError, StoreClosedError)):
        return pb.HA_NOT_AVAILABLE
    return pb.INTERNAL_SERVER_ERROR
