"""Typed request headers the broker role reads from ``extFields``.

SEND_MESSAGE (10) names its fields in full; SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE
(320) use one-letter names (SendMessageRequestHeaderV2) to save bytes on every send.
"""

from __future__ import annotations

from dataclasses import dataclass

from .codes import RequestCode
from .errors import RemotingProtocolError

# SendMessageRequestHeaderV2's short names
_V2_NAMES = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
    "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
    "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch",
}


def _required(ext: dict[str, str], name: str) -> str:
    value = ext.get(name)
    if value is None or value == "":
        raise RemotingProtocolError(f"the request header field {name} is missing")
    return value


def _number(ext: dict[str, str], name: str, default: int | None = None) -> int | None:
    value = ext.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise RemotingProtocolError(f"the request header field {name} is not a number: {value!r}") from None


@dataclass(slots=True)
class SendMessageHeader:
    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str
    reconsume_times: int | None
    max_reconsume_times: int | None
    batch: bool

    @classmethod
    def from_ext_fields(cls, code: int, ext: dict[str, str]) -> SendMessageHeader:
        if code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE) and "b" in ext:
            ext = {_V2_NAMES.get(k, k): v for k, v in ext.items()}
        return cls(
            producer_group=ext.get("producerGroup", ""),
            topic=_required(ext, "topic"),
            default_topic=ext.get("defaultTopic", ""),
            default_topic_queue_nums=_number(ext, "defaultTopicQueueNums", 0) or 0,
            queue_id=_number(ext, "queueId", 0) or 0,
            sys_flag=_number(ext, "sysFlag", 0) or 0,
            born_timestamp=_number(ext, "bornTimestamp", 0) or 0,
            flag=_number(ext, "flag", 0) or 0,
            properties=ext.get("properties", ""),
            reconsume_times=_number(ext, "reconsumeTimes"),
            max_reconsume_times=_number(ext, "maxReconsumeTimes"),
            # the C++ client sends batches as SEND_MESSAGE with batch "1"; Java says "true"
            batch=ext.get("batch", "false") in ("true", "1") or code == RequestCode.SEND_BATCH_MESSAGE,
        )


@dataclass(slots=True)
class PullMessageHeader:
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int | None
    suspend_timeout_millis: int
    subscription: str | None
    sub_version: int
    expression_type: str | None

    @classmethod
    def from_ext_fields(cls, ext: dict[str, str]) -> PullMessageHeader:
        return cls(
            consumer_group=_required(ext, "consumerGroup"),
            topic=_required(ext, "topic"),
            queue_id=_number(ext, "queueId", None) if "queueId" in ext else _missing("queueId"),
            queue_offset=_number(ext, "queueOffset", None) if "queueOffset" in ext else _missing("queueOffset"),
            max_msg_nums=_number(ext, "maxMsgNums", 32) or 32,
            sys_flag=_number(ext, "sysFlag", 0) or 0,
            commit_offset=_number(ext, "commitOffset"),
            suspend_timeout_millis=_number(ext, "suspendTimeoutMillis", 0) or 0,
            subscription=ext.get("subscription"),
            sub_version=_number(ext, "subVersion", 0) or 0,
            expression_type=ext.get("expressionType"),
        )


def _missing(name: str) -> int:
    raise RemotingProtocolError(f"the request header field {name} is missing")
