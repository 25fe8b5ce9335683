"""Typed request and response headers, read from and written to ``extFields``.

Field values are strings on the wire, parsed the way RocketMQ's header classes parse them
(Integer/Long.parseLong, Boolean.parseBoolean). SEND_MESSAGE (10) names its fields in full;
SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320) use SendMessageRequestHeaderV2's one-letter
names to save bytes on every send. A missing or malformed field raises ``HeaderError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import overload

from .codes import RequestCode
from .errors import HeaderError

# SendMessageRequestHeaderV2's short names (a..n) for SendMessageRequestHeader's fields
SEND_V2_NAMES = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums", "e": "queueId",
    "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
    "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName",
}
_SEND_V2_CODES = (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)

# PullSysFlag: the bits of a pull request's sysFlag
PULL_FLAG_COMMIT_OFFSET = 0x1  # commitOffset carries the consumer's offset to store
PULL_FLAG_SUSPEND = 0x2  # hold the pull (long polling) for suspendTimeoutMillis
PULL_FLAG_SUBSCRIPTION = 0x4  # subscription/expressionType/subVersion come with the pull
PULL_FLAG_CLASS_FILTER = 0x8
PULL_FLAG_LITE_PULL = 0x10

_INT_TEXT = re.compile(r"[+-]?[0-9]{1,19}")
_RANGES = {32: (-(1 << 31), (1 << 31) - 1), 64: (-(1 << 63), (1 << 63) - 1)}


# -- field parsing -------------------------------------------------------------------------
@overload
def get_str(ext: dict[str, str], name: str, default: str) -> str: ...
@overload
def get_str(ext: dict[str, str], name: str, default: None = None) -> str | None: ...
def get_str(ext: dict[str, str], name: str, default: str | None = None) -> str | None:
    """A string field; an empty value counts as absent (RocketMQ's binary header cannot tell)."""
    value = ext.get(name)
    return default if value is None or value == "" else value


def require_str(ext: dict[str, str], name: str) -> str:
    value = ext.get(name)
    if value is None or value == "":
        raise HeaderError(name, f"the request header field {name} is missing")
    return value


@overload
def get_int(ext: dict[str, str], name: str, default: int, *, bits: int = 32) -> int: ...
@overload
def get_int(ext: dict[str, str], name: str, default: None = None, *, bits: int = 32) -> int | None: ...
def get_int(ext: dict[str, str], name: str, default: int | None = None, *, bits: int = 32) -> int | None:
    """An Integer (``bits=32``) or Long (``bits=64``) field: optional sign, ASCII digits, in range."""
    value = ext.get(name)
    if value is None or value == "":
        return default
    low, high = _RANGES[bits]
    if _INT_TEXT.fullmatch(value):
        number = int(value)
        if low <= number <= high:
            return number
    raise HeaderError(name, f"the request header field {name} is not a {bits}-bit integer: {value!r}")


def require_int(ext: dict[str, str], name: str, *, bits: int = 32) -> int:
    value = get_int(ext, name, bits=bits)
    if value is None:
        raise HeaderError(name, f"the request header field {name} is missing")
    return value


def get_bool(ext: dict[str, str], name: str, default: bool = False) -> bool:
    """Boolean.parseBoolean ("true" in any case), and "1": the C++ client writes bools as 1/0."""
    value = ext.get(name)
    if value is None or value == "":
        return default
    return value == "1" or value.lower() == "true"


def _put(ext: dict[str, str], name: str, value: object) -> None:
    if value is not None:
        ext[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)


# -- send ----------------------------------------------------------------------------------
@dataclass(slots=True)
class SendMessageHeader:
    """SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE request header. ``batch`` means the
    body is MessageDecoder.encodeMessages output (see ``properties.decode_batch_body``): the
    Java client says so with code 320, the C++ client with code 10 or 310 and batch true/1."""

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
    unit_mode: bool
    max_reconsume_times: int | None
    batch: bool
    broker_name: str | None = None

    @classmethod
    def from_ext_fields(cls, code: int, ext: dict[str, str]) -> SendMessageHeader:
        """Topic and queueId are required (nothing can be stored without them); the other
        fields RocketMQ marks not-null default, since its V2 decoder only logs their absence."""
        if code in _SEND_V2_CODES and "b" in ext:  # a V2 code with long names is taken too
            ext = {SEND_V2_NAMES.get(k, k): v for k, v in ext.items()}
        return cls(
            producer_group=get_str(ext, "producerGroup", ""),
            topic=require_str(ext, "topic"),
            default_topic=get_str(ext, "defaultTopic", ""),
            default_topic_queue_nums=get_int(ext, "defaultTopicQueueNums", 0),
            queue_id=require_int(ext, "queueId"),
            sys_flag=get_int(ext, "sysFlag", 0),
            born_timestamp=get_int(ext, "bornTimestamp", 0, bits=64),
            flag=get_int(ext, "flag", 0),
            properties=ext.get("properties", ""),
            reconsume_times=get_int(ext, "reconsumeTimes"),
            unit_mode=get_bool(ext, "unitMode"),
            max_reconsume_times=get_int(ext, "maxReconsumeTimes"),
            batch=get_bool(ext, "batch") or code == RequestCode.SEND_BATCH_MESSAGE,
            broker_name=get_str(ext, "brokerName") or get_str(ext, "bname"),
        )

    def to_ext_fields(self, v2: bool = True) -> dict[str, str]:
        """The fields a client sends: short names for SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE."""
        ext: dict[str, str] = {}
        for name, value in (("producerGroup", self.producer_group), ("topic", self.topic),
                            ("defaultTopic", self.default_topic),
                            ("defaultTopicQueueNums", self.default_topic_queue_nums), ("queueId", self.queue_id),
                            ("sysFlag", self.sys_flag), ("bornTimestamp", self.born_timestamp), ("flag", self.flag),
                            ("properties", self.properties), ("reconsumeTimes", self.reconsume_times),
                            ("unitMode", self.unit_mode), ("maxReconsumeTimes", self.max_reconsume_times),
                            ("batch", self.batch), ("brokerName", self.broker_name)):
            _put(ext, name, value)
        if v2:
            short = {long: letter for letter, long in SEND_V2_NAMES.items()}
            return {short[k]: v for k, v in ext.items()}
        if "brokerName" in ext:
            ext["bname"] = ext.pop("brokerName")
        return ext


@dataclass(slots=True)
class SendMessageResponseHeader:
    """What a successful send answers. ``msg_id`` is the offsetMsgId (comma-separated, one per
    message, for a batch; ``queue_offset`` is then the first one's); ``transaction_id`` is the
    message's UNIQ_KEY. RocketMQ brokers add MSG_REGION and TRACE_ON to every send reply."""

    msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None
    batch_uniq_id: str | None = None
    region_id: str | None = "DefaultRegion"
    trace_on: bool | None = False

    def to_ext_fields(self) -> dict[str, str]:
        ext = {"msgId": self.msg_id, "queueId": str(self.queue_id), "queueOffset": str(self.queue_offset)}
        _put(ext, "transactionId", self.transaction_id)
        _put(ext, "batchUniqId", self.batch_uniq_id)
        _put(ext, "MSG_REGION", self.region_id)
        _put(ext, "TRACE_ON", self.trace_on)
        return ext

    @classmethod
    def from_ext_fields(cls, ext: dict[str, str]) -> SendMessageResponseHeader:
        return cls(require_str(ext, "msgId"), require_int(ext, "queueId"),
                   require_int(ext, "queueOffset", bits=64), get_str(ext, "transactionId"), get_str(ext, "batchUniqId"),
                   get_str(ext, "MSG_REGION"), None if "TRACE_ON" not in ext else get_bool(ext, "TRACE_ON"))


# -- pull ----------------------------------------------------------------------------------
@dataclass(slots=True)
class PullMessageHeader:
    """PULL_MESSAGE request header. ``sys_flag`` holds the PULL_FLAG_* bits; ``commit_offset``
    counts only with PULL_FLAG_COMMIT_OFFSET, ``subscription`` only with PULL_FLAG_SUBSCRIPTION
    (otherwise the broker uses the group's subscription from its heartbeats)."""

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
    max_msg_bytes: int | None = None

    @classmethod
    def from_ext_fields(cls, ext: dict[str, str]) -> PullMessageHeader:
        """Group, topic, queueId and queueOffset are required; the rest default."""
        return cls(
            consumer_group=require_str(ext, "consumerGroup"),
            topic=require_str(ext, "topic"),
            queue_id=require_int(ext, "queueId"),
            queue_offset=require_int(ext, "queueOffset", bits=64),
            max_msg_nums=get_int(ext, "maxMsgNums", 32),
            sys_flag=get_int(ext, "sysFlag", 0),
            commit_offset=get_int(ext, "commitOffset", bits=64),
            suspend_timeout_millis=get_int(ext, "suspendTimeoutMillis", 0, bits=64),
            subscription=ext.get("subscription"),
            sub_version=get_int(ext, "subVersion", 0, bits=64),
            expression_type=get_str(ext, "expressionType"),
            max_msg_bytes=get_int(ext, "maxMsgBytes"),
        )

    def to_ext_fields(self) -> dict[str, str]:
        ext: dict[str, str] = {}
        for name, value in (("consumerGroup", self.consumer_group), ("topic", self.topic),
                            ("queueId", self.queue_id), ("queueOffset", self.queue_offset),
                            ("maxMsgNums", self.max_msg_nums), ("sysFlag", self.sys_flag),
                            ("commitOffset", self.commit_offset),
                            ("suspendTimeoutMillis", self.suspend_timeout_millis),
                            ("subscription", self.subscription), ("subVersion", self.sub_version),
                            ("expressionType", self.expression_type), ("maxMsgBytes", self.max_msg_bytes)):
            _put(ext, name, value)
        return ext

    @property
    def flag_commit_offset(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_COMMIT_OFFSET)

    @property
    def flag_suspend(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_SUSPEND)

    @property
    def flag_subscription(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_SUBSCRIPTION)


@dataclass(slots=True)
class PullMessageResponseHeader:
    """What every pull reply carries, whatever its code (SUCCESS, PULL_NOT_FOUND,
    PULL_RETRY_IMMEDIATELY, PULL_OFFSET_MOVED): the Java client unboxes all four into longs."""

    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_which_broker_id: int = 0

    def to_ext_fields(self) -> dict[str, str]:
        return {"suggestWhichBrokerId": str(self.suggest_which_broker_id),
                "nextBeginOffset": str(self.next_begin_offset),
                "minOffset": str(self.min_offset), "maxOffset": str(self.max_offset)}

    @classmethod
    def from_ext_fields(cls, ext: dict[str, str]) -> PullMessageResponseHeader:
        return cls(require_int(ext, "nextBeginOffset", bits=64), require_int(ext, "minOffset", bits=64),
                   require_int(ext, "maxOffset", bits=64), require_int(ext, "suggestWhichBrokerId", bits=64))
