"""What the request mixins (pulls, pops, consumers, retries, queries, topic updates) use of the
``RemotingBroker`` they are mixed into: its parts and the methods they call across, declared
for the type checker. The broker sets and defines them; mypy checks that it does so with these
types, so a part that changes type is seen in every mixin that uses it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cache import QueueCache
    from store import GetResult, MessageStore

    from ..core.pop import PopService
    from ..stats import ProtocolStats
    from .access import RemotingAccess
    from .groups import ConsumerGroups
    from .long_poll import PullHolds
    from .messages import Origin
    from .pops import PopWaiters
    from .schedule import ScheduleService
    from .selectors import Selector, Selectors
    from .topics import TopicRegistry
    from .transactions import Producers


class BrokerParts:
    store: MessageStore
    cache: QueueCache
    stats: ProtocolStats
    access: RemotingAccess
    origin: Origin
    topics: TopicRegistry
    groups: ConsumerGroups
    selectors: Selectors
    holds: PullHolds
    schedule: ScheduleService
    producers: Producers
    pop: PopService
    pop_waiters: PopWaiters
    long_poll_max_s: float
    max_reconsume_times: int
    _locks: dict[tuple[str, str, int], tuple[str, float]]  # (group, topic, qid) -> (client, at)

    if TYPE_CHECKING:  # (defined by the broker, or by one mixin for another)
        def msg_id(self, position: int) -> str: ...

        def targets(self, topic: str, queue_id: int, properties: dict[str, str]) -> list[str]: ...

        def _writable(self, topic: str, queue_id: int, default_queues: int = 0,
                      sharding_key: str | None = None) -> int: ...

        def _record_topic(self, topic: str, properties: dict[str, str]) -> str: ...

        def _min_offset(self, queue: str) -> int: ...

        def _read(self, queue: str, topic: str, offset: int, max_messages: int,
                  selector: Selector) -> GetResult: ...
