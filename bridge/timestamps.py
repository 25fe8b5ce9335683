"""Starting and ending offsets from times, as the Kafka source's ``startingTimestamp``,
``startingOffsetsByTimestamp``, ``endingTimestamp`` and ``endingOffsetsByTimestamp``: per queue,
the first offset whose store time is at or after the time (the store's offset-for-time lookup,
``ConsumeQueueIndex.offset_for_time``, through the data API or the data directory).

A start reads messages stored at or after its time; an end is exclusive, so a batch reads the
messages stored before it. A queue with no message at or after a starting time follows
``startingOffsetsByTimestampStrategy``: ``error`` (default) fails the query, naming the queue;
``latest`` starts it at its latest offset (later micro-batches read what comes). A queue with
none at or after an ending time ends at latest (Kafka does the same). A queue not in the store
yet (a stream's filter queue before its first message) starts at 0: all it will hold is newer.
"""

from __future__ import annotations

from datetime import UTC, datetime

from .data_client import StoreClient
from .kafka_options import KafkaOptions
from .spark_options import OptionError


def _times(queues: dict[str, tuple[int, int]], every: int | None, each: dict[str, int] | None,
           name: str) -> dict[str, int]:
    if every is not None:
        return dict.fromkeys(queues, every)
    assert each is not None
    extra = sorted(set(each) - set(queues))
    if extra:
        raise OptionError(f"tidemq source: {name} names queues the query does not read: {', '.join(extra)}")
    return dict(each)


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def resolve_start(client: StoreClient, options: KafkaOptions, offsets: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Starting offsets of ``offsets``' queues ((first readable, next) each) from the starting
    time options; queues a JSON leaves out start at earliest."""
    name = "startingTimestamp" if options.starting_timestamp is not None else "startingOffsetsByTimestamp"
    times = _times(offsets, options.starting_timestamp, options.starting_by_timestamp, name)
    found = client.offsets_for_times(times) if times else {}
    out = {}
    for queue, (low, high) in offsets.items():
        if queue not in times:
            out[queue] = low
            continue
        at = found.get(queue)
        if at is None and high > 0 and options.strategy == "error":
            raise OptionError(
                f"tidemq source: no message of queue {queue!r} was stored at or after {name} "
                f"{times[queue]} ({_when(times[queue])}); set startingOffsetsByTimestampStrategy=latest to "
                "start such queues at their latest offset")
        out[queue] = high if at is None else at
    return out


def resolve_end(client: StoreClient, options: KafkaOptions, offsets: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Ending (exclusive) offsets from the ending time options; queues a JSON leaves out, and
    queues with no message at or after the time, end at latest."""
    name = "endingTimestamp" if options.ending_timestamp is not None else "endingOffsetsByTimestamp"
    times = _times(offsets, options.ending_timestamp, options.ending_by_timestamp, name)
    found = client.offsets_for_times(times) if times else {}
    return {queue: high if (at := found.get(queue)) is None else at for queue, (_, high) in offsets.items()}
