"""Ordered messages: the queue of a message with a sharding key (``__SHARDINGKEY``, RocketMQ 5's
message group) is chosen by the key, as RocketMQ's proxy chooses it -- Guava's
``Hashing.consistentHash`` of the key's Java ``String.hashCode`` over the topic's write queues --
so every message of one key goes to one queue, in the order sent, whatever queue the client
named, and a producer through this gateway and one through RocketMQ's proxy agree. Orderly
consumers then hold the queue's lock (LOCK_BATCH_MQ, consumers.py) while they consume it; gRPC
consumers pop it one stretch at a time (core/pop_order.py)."""

from __future__ import annotations

from protocols.java_hash import string_hash
from protocols.remoting.properties import SHARDING_KEY
from store import StoredMessage

_M64 = (1 << 64) - 1
_LCG = 2862933555777941757  # Guava's LinearCongruentialGenerator
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


def consistent_hash(value: int, buckets: int) -> int:
    """Guava's ``Hashing.consistentHash(long, int)``: a bucket in [0, buckets) that changes for
    few values when ``buckets`` grows. Java's 64-bit and 32-bit overflows are kept."""
    if buckets <= 0:
        raise ValueError("buckets must be positive")
    state = value & _M64
    candidate = 0
    while True:
        state = (_LCG * state + 1) & _M64
        draw = (state >> 33) + 1  # (int) (state >>> 33) + 1: wraps at 2**31
        if draw > _INT_MAX:
            draw -= 1 << 32
        jump = (candidate + 1) / (draw / 2 ** 31)
        following = _INT_MAX if jump >= _INT_MAX else _INT_MIN if jump <= _INT_MIN else int(jump)
        if not 0 <= following < buckets:
            return candidate
        candidate = following


def sharding_queue(key: str, write_queues: int) -> int:
    """The queue id a message of sharding key ``key`` goes to."""
    return consistent_hash(string_hash(key), write_queues)


def in_message_group(message: StoredMessage) -> bool:
    """Whether a stored message is one of an order (its sharding key: a message group)."""
    return SHARDING_KEY in message.properties
