"""What the ``tidemq`` source plans for a ``topicFilter`` query -- the filter's whole history in
its topic queues -- and how ranges become Spark partitions (``bridge/spark_source.py`` uses it).

A filter query reads the topic queue ``t:{topic}`` of every stored topic the filters match (the
gateway's ``POST /data/topics``, or the data directory's queue names), with offsets per topic
queue, history and live data alike: one offset space, so a checkpoint names one position per
message. Topics that start matching while a stream runs are picked up at their earliest offset,
as the Kafka source's ``subscribePattern`` picks up new partitions. The filter's wildcard queue
(``w:{filter}``) is not read: its offsets count other messages, and mixing the two in one query
would read a message twice or not at all across a restart. It can still be read on its own with
``queues=w:{filter}`` while a client keeps it subscribed. The exception is a held filter's queue
(``protocols.queue_names.HELD_FILTERS``: the presence events'), the one queue of its topics: a
filter that overlaps it reads it, with its own offsets, and keeps only its rows whose topic
matches (``bridge/held_rows.py``).

Checkpoints of earlier versions kept a filter query's offsets under its wildcard queue; such a
checkpoint is refused, saying how to go on, never read as if it were the new form.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from protocols.mqtt.topics import matches
from protocols.queue_names import WILDCARD_QUEUE_PREFIX, held_queues, held_topic, topic_of_queue

from .spark_options import OptionError


class CheckpointError(OptionError):
    """A checkpoint's offsets name queues this query does not read (an earlier version's form,
    or a changed topicFilter)."""


def reads_queue(topic_filters: Iterable[str], queue: str) -> bool:
    """Whether a filter query reads ``queue``: a topic queue whose topic one filter matches (not
    one of a held filter's topics), or the queue of a held filter one overlaps."""
    topic = topic_of_queue(queue)
    if topic is None:
        return queue in held_queues(topic_filters)
    return any(matches(f, topic) for f in topic_filters) and not held_topic(topic)


def check_checkpoint(topic_filters: tuple[str, ...], offsets: Mapping[str, int], what: str) -> None:
    """Refuse offsets (from Spark's checkpoint) of queues a filter query does not read."""
    held = sorted(q for q in offsets if held_topic(topic_of_queue(q) or ""))
    if held:
        raise CheckpointError(
            f"tidemq source: the checkpoint's {what} offsets name the topic queue {held[0]!r}: it was "
            "written by a version that read presence events from each client's topic queue; they are now read "
            f"from the queue of the filter the gateway holds for them ({', '.join(held_queues(topic_filters))}), "
            "with offsets of its own. Start a new checkpoint (startingOffsets as you need it).")
    old = sorted(q for q in offsets if q.startswith(WILDCARD_QUEUE_PREFIX) and q not in held_queues(topic_filters))
    if old:
        raise CheckpointError(
            f"tidemq source: the checkpoint's {what} offsets are those of the wildcard queue {old[0]!r}: it was "
            "written by a version that read a topicFilter through its wildcard queue, and topicFilter now reads "
            "the filter's topic queues (every stored message that matches). To go on from this checkpoint as "
            f"before, read option queues={old[0]} instead of topicFilter, and keep the filter indexed (an MQTT "
            "client subscribed to it, or the gateway's POST /data/filters: the query no longer holds it); or start "
            "a new checkpoint to read the filter's topic queues.")
    other = sorted(q for q in offsets if not reads_queue(topic_filters, q))
    if other:
        raise CheckpointError(
            f"tidemq source: the checkpoint's {what} offsets name queues topicFilter {list(topic_filters)} does not "
            f"match ({', '.join(map(repr, other[:5]))}{', ...' if len(other) > 5 else ''}): was topicFilter "
            "changed? Start a new checkpoint for a different filter.")


def pack(sizes: list[int], limit: int) -> list[list[int]]:
    """Consecutive ranges (given by their sizes, in order) grouped so that a group holds at most
    ``limit`` rows (a range larger than that alone): a filter over 100,000 topics with a few new
    messages each is a handful of Spark tasks, not 100,000. Indexes of the ranges per group."""
    groups: list[list[int]] = []
    rows = 0
    for i, size in enumerate(sizes):
        if groups and rows + size <= limit:
            groups[-1].append(i)
            rows += size
        else:
            groups.append([i])
            rows = size
    return groups


def share(sizes: list[int], parts: int) -> list[list[int]]:
    """Consecutive ranges (given by their sizes, in order) in at most ``parts`` groups of about
    the same rows: a range goes to the group its middle row falls in. A stream's micro-batch
    shared by the executors' cores this way leaves no last task with a remainder, which would
    be a wave of its own for one core. Indexes of the ranges per group."""
    total = sum(sizes)
    groups: dict[int, list[int]] = {}
    at = 0
    for i, size in enumerate(sizes):
        groups.setdefault(min(parts - 1, (2 * at + size) * parts // max(1, 2 * total)), []).append(i)
        at += size
    return list(groups.values())
