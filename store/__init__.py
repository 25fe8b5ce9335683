"""The unified store: one commitlog, consume-queue indexes in RocksDB, offsets and KV tables.

A library that knows no protocol: gateways hand it messages and queue names and read
back by (queue, offset).
"""

from .errors import (
    InvalidMessageError,
    MessageTooLargeError,
    PositionNotLoadedError,
    RecordCorruptError,
    StoreClosedError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
    StoreWriteError,
)
from .message import GetResult, GetStatus, Message, PutResult, StoredMessage, tag_hash
from .msgid import decode_msg_id, encode_msg_id
from .notify import NotifySubscription
from .options import FlushMode, StoreOptions
from .record import decode_properties, encode_properties
from .store import MessageStore

__all__ = [
    "FlushMode",
    "GetResult",
    "GetStatus",
    "InvalidMessageError",
    "Message",
    "MessageStore",
    "MessageTooLargeError",
    "NotifySubscription",
    "PositionNotLoadedError",
    "PutResult",
    "RecordCorruptError",
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
    "tag_hash",
]
