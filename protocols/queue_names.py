"""How each protocol's destinations are named as queues of the unified store: pure functions of
the protocol's own names, below both the gateway (which writes and reads the queues) and the
Spark source in ``bridge/`` (which names them for its ``topicFilter`` option without importing
the gateway). ``gateway/interop.py`` re-exports them with the other cross-protocol rules.

    t:{topic}            one concrete MQTT topic (every MQTT publish is indexed here)
    w:{filter}           one MQTT wildcard filter with subscribers (write amplification)
    q:{name}             one AMQP queue
    r:{topic}:{queueId}  one queue of a remoting topic
"""

from __future__ import annotations

from .mqtt.topics import is_wildcard

TOPIC_QUEUE_PREFIX = "t:"
WILDCARD_QUEUE_PREFIX = "w:"
AMQP_QUEUE_PREFIX = "q:"
REMOTING_QUEUE_PREFIX = "r:"


def topic_queue(topic: str) -> str:
    """The queue of one concrete MQTT topic."""
    return TOPIC_QUEUE_PREFIX + topic


def queue_for_filter(topic_filter: str) -> str:
    """The queue a subscription to ``topic_filter`` reads: its wildcard queue, or the topic's."""
    if is_wildcard(topic_filter):
        return WILDCARD_QUEUE_PREFIX + topic_filter
    return TOPIC_QUEUE_PREFIX + topic_filter


def amqp_queue(name: str) -> str:
    """The store queue of the AMQP queue ``name``."""
    return AMQP_QUEUE_PREFIX + name


def remoting_queue(topic: str, queue_id: int) -> str:
    """The store queue of queue ``queue_id`` of the remoting topic ``topic``."""
    return f"{REMOTING_QUEUE_PREFIX}{topic}:{queue_id}"


def remoting_topic_of(queue: str) -> tuple[str, int] | None:
    """(topic, queue id) of a remoting store queue ``r:{topic}:{queueId}``; None for another."""
    if not queue.startswith(REMOTING_QUEUE_PREFIX):
        return None
    topic, _, queue_id = queue[len(REMOTING_QUEUE_PREFIX):].rpartition(":")
    return (topic, int(queue_id)) if topic and queue_id.isdigit() else None
