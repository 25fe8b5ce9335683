"""Per-queue in-memory window of recent messages shared by all sessions of a node (high fan-out reads)."""

from .queue_cache import (
    ANSWER_OVERHEAD,
    CacheStats,
    MessageSource,
    QueueCache,
)
from .window import MESSAGE_OVERHEAD, WINDOW_OVERHEAD, message_cost

__all__ = [
    "ANSWER_OVERHEAD",
    "MESSAGE_OVERHEAD",
    "WINDOW_OVERHEAD",
    "CacheStats",
    "MessageSource",
    "QueueCache",
    "message_cost",
]
