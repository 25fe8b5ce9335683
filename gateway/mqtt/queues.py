"""Which store queues an MQTT message goes to, and which queue a subscription reads.

Read amplification: every concrete topic is its own queue (``t:{topic}``). Write
amplification only for wildcards: each wildcard filter with at least one subscriber has a
queue (``w:{filter}``) and a publish is also indexed into every matching one, found through a
topic-filter trie. Subscribing to a concrete topic reads its topic queue directly.

One exception: a topic of a held filter (``protocols.queue_names.HELD_FILTERS``, the presence
events' topics, one per client) is indexed into the filter's queue while it is held, and into
its own queue only while a subscription to exactly that topic exists.
"""

from __future__ import annotations

from collections.abc import Callable

from protocols.mqtt.topic_tree import TopicTree
from protocols.mqtt.topics import is_wildcard
from protocols.queue_names import HELD_FILTERS

from ..interop import TOPIC_QUEUE_PREFIX, WILDCARD_QUEUE_PREFIX


class WildcardQueues:
    """The wildcard filters that currently have subscribers (online or in persistent sessions),
    reference-counted; ``queues_for(topic)`` is the publish path's list of target queues."""

    def __init__(self, memo_entries: int = 65_536, *, subscribers_known: bool = True) -> None:
        self._tree: TopicTree[int] = TopicTree()
        # topic -> its target queues; devices publish to the same topics over and over, so
        # the trie walk is remembered until the set of wildcard filters changes
        self._memo: dict[str, list[str]] = {}
        self._memo_entries = memo_entries
        # other gateways' queues that want MQTT publishes too (AMQP queues bound to amq.topic,
        # remoting topic queues): they join() and call what it returns when their answers change
        self._extras: list[Callable[[str], list[str]]] = []
        # concrete filters with subscribers (online or in persistent sessions), counted the same
        # way: their topic queue is always written, so only "is it read?" needs them (a
        # mandatory AMQP publish to amq.topic that nothing reads is returned)
        self._concrete: dict[str, int] = {}
        # False on a store node: its gateway nodes tell it their wildcard filters only, so it
        # cannot tell whether a concrete topic is read, and counts every one as read
        self.subscribers_known = subscribers_known

    def invalidate(self) -> None:
        self._memo.clear()

    def __len__(self) -> int:
        return len(self._tree)

    def add(self, topic_filter: str) -> None:
        if not is_wildcard(topic_filter):
            self._concrete[topic_filter] = self._concrete.get(topic_filter, 0) + 1
        else:
            count = self._tree.get(topic_filter) or 0
            self._tree[topic_filter] = count + 1
            if not count:
                self._memo.clear()

    def remove(self, topic_filter: str) -> None:
        if not is_wildcard(topic_filter):
            count = self._concrete.pop(topic_filter, 0)
            if count > 1:
                self._concrete[topic_filter] = count - 1
            return
        count = self._tree.get(topic_filter) or 0
        if count <= 1:
            self._tree.pop(topic_filter)
            self._memo.clear()
        else:
            self._tree[topic_filter] = count - 1

    # -- gateway.ports.FilterRegistry: a subscription is one more reference ---------------------
    def hold(self, topic_filter: str, holder: str, durable: bool) -> None:
        self.add(topic_filter)

    def release(self, topic_filter: str, holder: str) -> None:
        self.remove(topic_filter)

    def subscribed(self, topic: str) -> bool:
        """Whether a subscription to exactly this topic exists (wildcards: see queues_for)."""
        return topic in self._concrete or not self.subscribers_known

    def reads(self, queue: str) -> bool:
        """Whether a subscription or a hold reads the store queue (a reader: store/retention/reclaim.py)."""
        if queue.startswith(TOPIC_QUEUE_PREFIX):
            return self.subscribed(queue[len(TOPIC_QUEUE_PREFIX):])
        if queue.startswith(WILDCARD_QUEUE_PREFIX):
            return queue[len(WILDCARD_QUEUE_PREFIX):] in self._tree or not self.subscribers_known
        return False

    def join(self, targets: Callable[[str], list[str]]) -> Callable[[], None]:
        """gateway.interop.TopicSpace: another protocol's targets for MQTT publishes."""
        self._extras.append(targets)
        self.invalidate()
        return self.invalidate

    def queues_for(self, topic: str) -> list[str]:
        """The queues a message to ``topic`` is indexed into (the caller must not modify it).
        The broker's own ``$`` topics are not remembered: a presence event's topic is its
        client's alone, written once a connection (remembered, each idle connection would
        hold an entry and push the devices' topics out); nor does one get a queue of its own
        while its held filter's queue has it, unless a subscription to exactly it exists."""
        queues = self._memo.get(topic)
        if queues is None:
            queues = [TOPIC_QUEUE_PREFIX + topic]
            held = False
            for topic_filter, _ in self._tree.match(topic):
                queues.append(WILDCARD_QUEUE_PREFIX + topic_filter)
                held = held or topic_filter in HELD_FILTERS
            for extra in self._extras:
                queues.extend(extra(topic))
            if topic.startswith("$"):
                if held and not self.subscribed(topic):
                    del queues[0]
                return queues
            if len(self._memo) >= self._memo_entries:
                self._memo.clear()
            self._memo[topic] = queues
        return queues
