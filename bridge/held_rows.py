"""The rows a ``topicFilter`` query keeps of a held filter's queue (``protocols.queue_names.HELD_FILTERS``,
the presence events'): the one queue of that filter's topics, read with its own offsets by every
filter that overlaps it (``bridge/planning.py``), holds the topics a narrower filter does not
match too; their rows are dropped on the executor, after the read, before Spark sees them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from protocols.mqtt.topics import covers, matches
from protocols.queue_names import WILDCARD_QUEUE_PREFIX, held_queues

from .kafka_options import KafkaOptions
from .pruning import Projection, projection, source_schema
from .spark_partitions import read_any


class HeldRows:
    """A filter query's read of a held filter's queue keeps only the rows whose topic its filters
    match (the queue holds every topic of the held filter); the query's columns are read with
    ``topic`` for that, and left as the query asked. Picklable: it travels to the executors."""

    def __init__(self, topic_filters: tuple[str, ...], queues: list[str], columns: Projection,
                 schema: StructType | None, kafka: KafkaOptions) -> None:
        self.topic_filters, self.queues, self.columns = topic_filters, frozenset(queues), columns
        full = source_schema(kafka)
        asked = full if schema is None else schema
        if "topic" not in asked.fieldNames():
            asked = StructType([*asked.fields, full["topic"]])
        self.checked = projection(asked, kafka)  # (the query's columns, then topic if it has none)

    @classmethod
    def of(cls, topic_filters: tuple[str, ...], columns: Projection, schema: StructType | None,
           kafka: KafkaOptions) -> HeldRows | None:
        """None when no row needs checking: no held filter overlapped, or each one covered."""
        queues = [q for q in held_queues(topic_filters)
                  if not any(covers(f, q[len(WILDCARD_QUEUE_PREFIX):]) for f in topic_filters)]
        return cls(topic_filters, queues, columns, schema, kafka) if queues else None

    def reads(self, part: InputPartition) -> bool:
        """Whether the partition (a queue range or several) reads a held filter's queue."""
        ranges = getattr(part, "ranges", None) or [part]
        return any(getattr(r, "queue", None) in self.queues for r in ranges)

    def kept(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches`` (of the ``checked`` columns) as the query's columns, without the rows whose
        topic no filter matches (a topic queue's rows all match: they pass)."""
        width, at = len(self.columns.names), self.checked.names.index("topic")
        for batch in batches:
            topics = batch.column(at)
            seen = pc.unique(topics).to_pylist()
            wanted = [t for t in seen if any(matches(f, t) for f in self.topic_filters)]
            if len(wanted) < len(seen):
                batch = batch.filter(pc.is_in(topics, value_set=pa.array(wanted, pa.string())))
            if batch.num_rows:
                yield pa.RecordBatch.from_arrays(batch.columns[:width], schema=self.columns.arrow)


def read_checked(part: InputPartition, columns: Projection, held: HeldRows | None) -> Iterator[pa.RecordBatch]:
    """The rows of a planned partition (``spark_partitions.read_any``), a held filter's queue's
    checked by ``held``."""
    if held is None or not held.reads(part):
        return read_any(part, columns)
    return held.kept(read_any(part, held.checked))
