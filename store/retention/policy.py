"""What the store asks the gateway about each queue (from its per-topic configuration)."""

from __future__ import annotations

from typing import Protocol


class QueuePolicy(Protocol):
    @property
    def has_rules(self) -> bool:
        """Whether any queue has a rule of its own (else ``retention`` is None for every queue,
        and no queue is walked for it)."""
        ...

    @property
    def longest_hours(self) -> float:
        """The longest age any per-queue rule keeps (0: no rule has an age): commitlog segments
        are kept at least this long (retention/segments.py)."""
        ...

    def retention(self, queue: str) -> tuple[float, int] | None:
        """(max age in hours, max bytes) of the queue's own rule, 0 for no limit of that kind;
        None: the global retention applies (retention/queues.py)."""
        ...

    @property
    def light_prefixes(self) -> tuple[str, ...]:
        """The name prefixes of queues that may be removed when idle (none: nothing is)."""
        ...

    def idle_ttl_s(self, queue: str) -> float:
        """Seconds without a new message after which the queue is removed if nobody reads it;
        0 = never, for queues that are not light (retention/reclaim.py)."""
        ...
