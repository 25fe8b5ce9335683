"""Exceptions raised at the edge of the store; protocol layers translate them once."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the store raises."""


class StoreClosedError(StoreError):
    """The store is closed (or closing) and accepts no more writes."""


class StoreLockedError(StoreError):
    """Another process holds the data directory open for writing."""


class StoreWriteError(StoreError):
    """A write to the commitlog or the index failed; the affected puts were not stored."""


class MessageTooLargeError(StoreError):
    """A message does not fit the configured maximum record size."""


class InvalidMessageError(StoreError):
    """A message or queue name that the store cannot encode (empty queue list, oversized field)."""


class StoreCorruptError(StoreError):
    """Damaged data in the middle of the commitlog: the store refuses to start without repair."""

    def __init__(self, message: str, *, path: str, position: int) -> None:
        super().__init__(message)
        self.path = path
        self.position = position


class RecordCorruptError(StoreError):
    """A record read back from the commitlog failed its checks (magic, length or CRC)."""


class PositionNotLoadedError(StoreError):
    """``read_at`` cannot answer synchronously: the message is not at hand in this process (a
    gateway node reads messages from its store node). Not "removed": read it asynchronously."""

    def __init__(self, position: int) -> None:
        super().__init__(f"the message at position {position} is not loaded here")
        self.position = position


class NotLeaderError(StoreWriteError):
    """This store is a follower of a replicated group (or has lost its leadership): writes go
    to the leader. Nothing was stored."""


class NotReplicatedError(StoreWriteError):
    """Fewer replicas than the group's ``min_insync`` are in sync, or they did not confirm the
    write in time: the write is not acknowledged (it may still be kept and delivered later)."""
