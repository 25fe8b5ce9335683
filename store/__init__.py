"""The unified store: one commitlog, consume-queue indexes in RocksDB, offsets and KV tables.

A library that knows no protocol: gateways hand it messages and queue names and read back by
(queue, offset). This module is its front door: other layers import the store from here only,
besides the bulk readers' entry points ``store.read.readonly`` and ``store.read.columns``
(an import-linter contract in pyproject.toml says so). Inside, the sub-packages are the
commitlog (``log``), the consume-queue index and dispatch (``index``), writing (``write``),
reading (``read``), the meta tables (``meta``), held messages (``holds``), retention and
reclaim (``retention``), the message records (``messages``) and replication (``replica``).
"""

from .clock import now_ms
from .errors import (
    InvalidMessageError,
    MessageTooLargeError,
    NotLeaderError,
    NotReplicatedError,
    PositionNotLoadedError,
    RecordCorruptError,
    StoreClosedError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
    StoreWriteError,
)
from .holds.codec import HALF, HELD, TIMER
from .holds.held_messages import Hold
from .index.notify import NotifyHub, NotifySubscription
from .log.msgid import decode_msg_id, encode_msg_id
from .log.record import RecordView, decode_properties, encode_properties
from .log_limit import RateLimitedLog
from .messages import GetResult, GetStatus, Message, PutResult, StoredMessage, tag_hash
from .meta.popstate import CheckPoint, PopCheckPoints
from .meta.tables import KvTable
from .options import FlushMode, StoreOptions
from .replica.link import InSyncSet
from .replica.node import ReplicaNode, ReplicaSettings
from .stats import LatencyHistogram
from .store import MessageStore
from .write.batching import receipt_messages, receipt_tails

__all__ = [
    "HALF",
    "HELD",
    "TIMER",
    "CheckPoint",
    "FlushMode",
    "GetResult",
    "GetStatus",
    "Hold",
    "InvalidMessageError",
    "InSyncSet",
    "KvTable",
    "LatencyHistogram",
    "Message",
    "MessageStore",
    "MessageTooLargeError",
    "NotLeaderError",
    "NotReplicatedError",
    "NotifyHub",
    "NotifySubscription",
    "PopCheckPoints",
    "PositionNotLoadedError",
    "PutResult",
    "RateLimitedLog",
    "RecordCorruptError",
    "RecordView",
    "ReplicaNode",
    "ReplicaSettings",
    "StoreClosedError",
    "StoreCorruptError",
    "StoreError",
    "StoreLockedError",
    "StoreOptions",
    "StoreWriteError",
    "StoredMessage",
    "decode_msg_id",
    "decode_properties",
    "encode_msg_id",
    "encode_properties",
    "now_ms",
    "receipt_messages",
    "receipt_tails",
    "tag_hash",
]
