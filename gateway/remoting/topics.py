"""Remoting topics: their queue counts and permissions, kept in the store's ``remoting.topics``
table, and how topic queues map onto store queues and onto MQTT topics.

Each remoting topic queue is the store queue ``r:{topic}:{queueId}``. The MQTT mapping, as
apache/rocketmq-mqtt does it: a remoting topic is an MQTT first level. An MQTT publish to
``T/a/b`` where ``T`` is a remoting topic is also indexed into one queue of ``T`` (chosen by a
hash of the full MQTT topic, so one MQTT topic keeps its order), and remoting consumers see the
rest of the levels in the ``mqttSecondTopic`` property (``/a/b``). A remoting send to ``T``
reaches MQTT subscribers of ``T`` -- or of ``T`` + its ``mqttSecondTopic`` property when set.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import asdict, dataclass

from store import KvTable

from ..interop import DLQ_PREFIX, RETRY_PREFIX, remoting_queue

TOPICS_TABLE = "remoting.topics"
# RocketMQ's TopicValidator: a topic name is at most 127 of these characters
TOPIC_NAME = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def valid_topic(name: str) -> bool:
    return bool(TOPIC_NAME.match(name))


@dataclass(slots=True)
class TopicConfig:
    name: str
    read_queues: int
    write_queues: int
    perm: int = PERM_READ | PERM_WRITE

    def queue_for_mqtt_topic(self, mqtt_topic: str) -> int:
        """One MQTT topic always lands in the same queue of its remoting topic (order)."""
        return zlib.crc32(mqtt_topic.encode()) % self.write_queues


class TopicRegistry:
    """Every remoting topic of the node. Topics are created on first use (send, pull, route
    lookup) with the configured queue counts, as a broker with autoCreateTopicEnable does."""

    def __init__(self, table: KvTable, *, default_queues: int) -> None:
        self._table = table
        self.default_queues = default_queues
        self.topics: dict[str, TopicConfig] = {}
        for name, raw in table.items():
            try:
                self.topics[name] = TopicConfig(**json.loads(raw))
            except (ValueError, TypeError):
                continue  # an unreadable row: the topic is created again on use
        self.on_changed: list = []  # callbacks(name) when a topic is created or changed

    def get(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)

    def new_config(self, name: str, queues: int | None = None) -> TopicConfig:
        """The topic as ``ensure`` creates it, with ``queues`` (default: the configured count).
        Raises ValueError for a name RocketMQ would refuse."""
        if not valid_topic(name):
            raise ValueError(f"topic name {name!r} is not valid (at most 127 of [%|a-zA-Z0-9_-])")
        count = queues if queues and queues > 0 else self.default_queues
        return TopicConfig(name, count, count)

    def ensure(self, name: str, queues: int | None = None) -> TopicConfig:
        """The topic, created as ``new_config`` makes it when new."""
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        return self.put(self.new_config(name, queues))

    def put(self, topic: TopicConfig) -> TopicConfig:
        """Create or change a topic (its checks are the caller's: topic_updates.py)."""
        self.topics[topic.name] = topic
        self._table.put(topic.name, json.dumps(asdict(topic)).encode())
        for callback in self.on_changed:
            callback(topic.name)
        return topic

    # -- the MQTT mapping ---------------------------------------------------------------------
    def queues_for_mqtt(self, mqtt_topic: str) -> list[str]:
        """Store queues an MQTT publish to ``mqtt_topic`` is also indexed into: one queue of
        the remoting topic named by its first level, if there is one."""
        first = mqtt_topic.split("/", 1)[0]
        if first.startswith("%"):  # (retry, dead-letter and system topics are no MQTT topics: interop.py)
            return []
        topic = self.topics.get(first)
        if topic is None or not topic.perm & PERM_READ:
            return []
        return [remoting_queue(first, topic.queue_for_mqtt_topic(mqtt_topic))]
