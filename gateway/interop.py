"""Where the protocols meet: one place for the rules a message follows from one protocol to
another through the unified store.

Store queues, by who reads them (the rule is ``protocols/queue_names.py``, re-exported here):

    t:{topic}            one concrete MQTT topic (every MQTT publish is indexed here)
    w:{filter}           one MQTT wildcard filter with subscribers (write amplification)
    q:{name}             one AMQP queue
    r:{topic}:{queueId}  one queue of a remoting topic

A stored message's flag says which protocol published it, so that the others can present it:
``MQTT_FLAG`` (0x100) with the QoS in bits 0-1, ``RETAIN_FLAG`` and ``PROPS_FLAG`` (MQTT 5.0
properties kept); ``AMQP_FLAG`` (0x200) with ``PERSISTENT_FLAG`` (0x01). Store properties whose
names start with ``INTERNAL_PREFIXES`` belong to a protocol gateway and are never shown to
clients as user properties.

Names between the protocols (as RabbitMQ's MQTT plugin and apache/rocketmq-mqtt do it):

    MQTT topic          AMQP amq.topic routing key   remoting
    a/b/c               a.b.c                        topic a, mqttSecondTopic /b/c
    filter a/+/#        binding key a.*.#            --
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from protocols.mqtt.topics import (
    TopicError,
    validate_topic_filter,
    validate_topic_name,
)

# store queue names: defined below the gateway (the Spark source in bridge/ names queues the same
# way without importing the gateway), re-exported here with the other cross-protocol rules
from protocols.queue_names import (  # noqa: F401
    AMQP_QUEUE_PREFIX,
    REMOTING_QUEUE_PREFIX,
    TOPIC_QUEUE_PREFIX,
    WILDCARD_QUEUE_PREFIX,
    amqp_queue,
    of_dollar_topics,
    queue_for_filter,
    remoting_queue,
    remoting_topic_of,
    topic_of_queue,
    topic_queue,
)

# -- the flag of a stored message -------------------------------------------------------------
MQTT_FLAG = 0x100  # published over MQTT; its QoS in bits 0-1
QOS_MASK = 0x03
RETAIN_FLAG = 0x04  # an MQTT publish with RETAIN set
PROPS_FLAG = 0x08  # an MQTT 5.0 publish whose properties are kept (store property PROPS)
AMQP_FLAG = 0x200  # published over AMQP
PERSISTENT_FLAG = 0x01  # an AMQP publish with delivery-mode 2

# store properties that belong to a protocol gateway, not to the message's user properties
INTERNAL_PREFIXES = ("rmq.", "mqtt.", "amqp.")


class TopicSpace(Protocol):
    """MQTT's topic space as the other protocols meet it (``gateway/mqtt/queues.py``
    WildcardQueues): the store queues a publish to an MQTT topic goes to, and whether a
    subscriber reads the topic. A protocol with targets of its own there (AMQP queues bound to
    amq.topic, remoting topics) joins it, given at construction, never wired afterwards."""

    def queues_for(self, topic: str) -> list[str]: ...

    def subscribed(self, topic: str) -> bool: ...

    def join(self, targets: Callable[[str], list[str]]) -> Callable[[], None]:
        """Add ``targets(topic)`` to every publish's queues; returns what to call when the
        answers it gives change."""
        ...


# -- MQTT topics <-> AMQP routing keys --------------------------------------------------------
def mqtt_topic_to_routing_key(topic: str) -> str:
    return topic.replace("/", ".")


def routing_key_to_mqtt_topic(routing_key: str) -> str:
    return routing_key.replace(".", "/")


def valid_mqtt_topic(topic: str) -> bool:
    """A routing key of amq.topic crosses into MQTT topic space when its topic is one (not $...)."""
    try:
        validate_topic_name(topic)
    except TopicError:
        return False
    return not topic.startswith("$")


def binding_key_to_mqtt_filter(binding_key: str) -> str | None:
    """The MQTT topic filter that holds every MQTT topic an amq.topic binding key can match
    (``*`` -> ``+``, ``#`` -> ``#``; a ``#`` before the last word makes it ``#`` from there:
    a wider filter, never a narrower one). None: the key matches no MQTT topic name (a word
    with ``+`` or ``#`` in it, an empty key)."""
    levels = []
    for word in binding_key.split("."):
        if word == "#":
            levels.append("#")
            break
        levels.append("+" if word == "*" else word)
    topic_filter = "/".join(levels)
    try:
        validate_topic_filter(topic_filter)
    except TopicError:
        return None
    return topic_filter


# -- remoting topics <-> MQTT topics ----------------------------------------------------------
SECOND_TOPIC_PROPERTY = "mqttSecondTopic"  # the MQTT levels after the remoting topic, with "/"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


def mqtt_topic_of(topic: str, second: str | None) -> str | None:
    """The MQTT topic a remoting message to ``topic`` goes to (None: not an MQTT topic)."""
    if topic.startswith("%"):  # %RETRY%, %DLQ% and the other system topics
        return None
    if second:
        return topic + (second if second.startswith("/") else "/" + second)
    return topic
