"""Lookup KV of online state (client id -> node, queue -> interested nodes) over a consistent-hash ring.

``api``: the ``Lookup`` interface, ``LookupOptions``, ``IN_DOUBT``, counters. ``ring``: mmh3 ring,
slots, membership (sans-IO). ``embedded``: the KV partitioned over the gateway nodes, over a
``transport`` (in-process for tests) or ``tcp`` (remoting frames, codes in ``link``).
``redis_backend.RedisLookup``: the same interface on Redis (imported on demand).
"""

from .api import (
    IN_DOUBT,
    ClientList,
    FallbackReason,
    InDoubt,
    Lookup,
    LookupOptions,
    LookupStats,
)
from .embedded import EmbeddedLookup
from .ring import Membership, Ring

__all__ = ["IN_DOUBT", "ClientList", "EmbeddedLookup", "FallbackReason", "InDoubt", "Lookup", "LookupOptions",
           "LookupStats", "Membership", "Ring"]
