"""How each protocol's destinations are named as queues of the unified store: pure functions of
the protocol's own names, below both the gateway (which writes and reads the queues) and the
Spark source in ``bridge/`` (which names them for its ``topicFilter`` option without importing
the gateway). ``gateway/interop.py`` re-exports them with the other cross-protocol rules.

    t:{topic}            one concrete MQTT topic (every MQTT publish is indexed here, but those
                         to a held filter's topics: ``HELD_FILTERS``)
    w:{filter}           one MQTT wildcard filter with subscribers (write amplification), or held
    q:{name}             one AMQP queue
    r:{topic}:{queueId}  one queue of a remoting topic
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .mqtt.topics import is_wildcard, matches, overlaps

TOPIC_QUEUE_PREFIX = "t:"
WILDCARD_QUEUE_PREFIX = "w:"
AMQP_QUEUE_PREFIX = "q:"
REMOTING_QUEUE_PREFIX = "r:"

# Filters a node holds from its start (the broker's presence events, gateway/mqtt/presence.py)
# whose topics get no queue of their own: each topic is a client's, written once a connection, and
# a queue each would make every idle connection cost a queue. A message to a topic one of them
# matches is indexed into the filter's wildcard queue (and into the topic's queue only while a
# subscription to exactly that topic exists), so that queue, not the topics', holds their history.
HELD_FILTERS = ("$SYS/brokers/+/clients/+/+",)
HELD_QUEUES = frozenset(WILDCARD_QUEUE_PREFIX + f for f in HELD_FILTERS)


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


def topic_of_queue(queue: str) -> str | None:
    """The MQTT topic of a topic queue ``t:{topic}``; None for any other queue."""
    return queue[len(TOPIC_QUEUE_PREFIX):] if queue.startswith(TOPIC_QUEUE_PREFIX) else None


def of_dollar_topics(name: str) -> bool:
    """Whether a queue (or a name prefix) is of ``$`` topics (``$SYS/...``): a topic or wildcard
    queue whose topic starts with ``$``, which listings leave out unless asked for, as MQTT's
    wildcards do (MQTT 4.7.2)."""
    return name.startswith((TOPIC_QUEUE_PREFIX + "$", WILDCARD_QUEUE_PREFIX + "$"))


def topic_queue_prefix(topic_filter: str) -> str:
    """The name prefix every topic queue a (validated) filter matches starts with: its levels
    before the first wildcard. ``a/+/b`` -> ``t:a/``; ``a/#`` -> ``t:a`` (``#`` matches the parent
    ``a`` too); ``+/b`` -> ``t:``; a plain topic -> its queue's whole name."""
    if not is_wildcard(topic_filter):
        return topic_queue(topic_filter)
    levels = topic_filter.split("/")
    literal = levels[:next(i for i, level in enumerate(levels) if level in ("+", "#"))]
    if levels[len(literal)] == "#" and literal:
        return topic_queue("/".join(literal))
    return topic_queue("".join(level + "/" for level in literal))


def held_topic(topic: str) -> bool:
    """Whether ``topic``'s history is in a held filter's queue, not its own (``HELD_FILTERS``)."""
    return topic.startswith("$") and any(matches(f, topic) for f in HELD_FILTERS)


def held_queues(topic_filters: Iterable[str]) -> list[str]:
    """The queues of the held filters that some of the (validated) filters overlap: where the
    messages of their topics that match are (with messages of other topics, which readers drop)."""
    filters = list(topic_filters)
    return [WILDCARD_QUEUE_PREFIX + h for h in HELD_FILTERS if any(overlaps(f, h) for f in filters)]


def matching_topic_queues(topic_filters: Iterable[str], names: Callable[[str], Iterable[str]]) -> list[str]:
    """The queues that hold every stored message whose topic matches any of the (validated)
    filters, each once, from ``names(prefix)``: the names of a store's queues starting with
    ``prefix``, in order. Every publish is indexed into its topic's queue, whoever subscribes,
    so these are the topic queues whose topics match (sorted), but for the topics of a held
    filter (``HELD_FILTERS``): their filter's queue comes last instead, if it exists, and holds
    other topics' messages too. Each distinct prefix is scanned once (a prefix that another one
    extends is not scanned again), so overlapping filters cost one scan."""
    filters = list(dict.fromkeys(topic_filters))
    prefixes: list[str] = []
    for prefix in sorted({topic_queue_prefix(f) for f in filters}):
        if not prefixes or not prefix.startswith(prefixes[-1]):
            prefixes.append(prefix)
    found: list[str] = []
    for prefix in prefixes:
        for name in names(prefix):
            topic = name[len(TOPIC_QUEUE_PREFIX):]
            if any(matches(f, topic) for f in filters) and not held_topic(topic):
                found.append(name)
    for queue in held_queues(filters):
        if queue in names(queue):  # (the name is its own prefix: a scan of at most a few names)
            found.append(queue)
    return found
