"""A queue's window in the cache: the messages it holds, and what they are accounted for."""

from __future__ import annotations

from store import StoredMessage

# Memory a cached message costs beyond its variable fields (body, raw properties, topic,
# raw queue list): the StoredMessage object, its msg id string, the ints and the headers of
# the bytes/str objects it holds, and its list slot. Measured at ~550 bytes on CPython 3.11.
MESSAGE_OVERHEAD = 560
# Memory a queue's window costs with no message in it: its record, list, dict entry.
WINDOW_OVERHEAD = 1024


def message_cost(message: StoredMessage) -> int:
    """Bytes a cached message is accounted for against ``max_bytes``: its fields, and one more
    copy of the body for what readers keep beside the object while it lives (the MQTT
    gateway's encoded PUBLISH)."""
    return (
        2 * len(message.body) + len(message.raw_properties) + len(message.topic) + len(message.raw_queues)
        + MESSAGE_OVERHEAD
    )


class Window:
    """Messages [start, end) of one queue, plus what the cache last learned about the queue."""

    __slots__ = ("answers", "bytes", "costs", "head", "max_offset", "messages", "min_offset", "notified",
                 "read_wakes", "served", "start", "wakes")

    def __init__(self) -> None:
        self.messages: list[StoredMessage] = []
        self.head = 0  # messages[head:] are live; the head is compacted away in bulk
        # costs[i + 1] - costs[i] is message_cost(messages[i]): a head dropped is accounted
        # for without costing its messages again
        self.costs = [0]
        self.start = -1  # offset of messages[head]; -1 until a read places the window
        self.served = 0  # the furthest offset a read of the window was served up to
        self.bytes = WINDOW_OVERHEAD
        self.min_offset = 0  # as of the last store read
        self.max_offset = 0  # highest max offset a store read or a notify reported
        # Set by on_notify: from then on the notify handler reports every growth of the queue,
        # so "max_offset <= end" means nothing new for certain (a pending notify will say so).
        self.notified = False
        self.answers = 0  # offered answers held for this queue (the record stays while there are any)
        self.wakes = 0  # on_notify calls (each wakes the queue's readers)
        self.read_wakes = 0  # ``wakes`` as of the last read of the queue

    @property
    def end(self) -> int:
        return self.start + len(self.messages) - self.head

    @property
    def empty(self) -> bool:
        return self.head == len(self.messages)
