"""Lookup KV of online state (client id -> node; with Redis, queue -> interested nodes too).

``api``: the ``Lookup`` and ``InterestLookup`` interfaces, ``LookupOptions``, ``IN_DOUBT``, counters. ``ring``: mmh3 ring,
slots, membership (sans-IO). ``embedded``: the KV partitioned over the gateway nodes, over a
``transport`` (in-process for tests) or ``tcp`` (remoting frames, codes in ``link``).
``redis_backend.RedisLookup``: the same interface on Redis, and queue interest for the store
node's notify routing (imported on demand).
"""

from .api import (
    IN_DOUBT,
    ClientList,
    FallbackReason,
    InDoubt,
    InterestLookup,
    Lookup,
    LookupOptions,
    LookupStats,
)
from .embedded import EmbeddedLookup
from .ring import Membership, Ring

__all__ = ["IN_DOUBT", "ClientList", "EmbeddedLookup", "FallbackReason", "InDoubt", "InterestLookup", "Lookup",
           "LookupOptions", "LookupStats", "Membership", "Ring"]
