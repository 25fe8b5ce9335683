"""The topic queues (and held filters' queues, which ``POST /data/topics`` lists for their
topics) that changed since a reader last listed them: the ``since`` of ``POST /data/topics``, so
that a streaming reader's listing each trigger costs what changed, not every queue its filters
match.

A cursor is ``{epoch}:{seq}``: ``seq`` counts the store's notify events (one per dispatch) since
this gateway started listening, ``epoch`` names that start, so a cursor from before a restart
is not taken for a current one (the reader lists everything again). It starts listening at the
first listing that hands out a cursor: a gateway with no streaming reader pays nothing.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable

from protocols.queue_names import HELD_QUEUES, TOPIC_QUEUE_PREFIX

Listen = Callable[[Callable[[dict[str, int]], None]], None]
MAX_TRACKED = 1_000_000  # topic queues remembered; older changes are forgotten (their cursors list all)


class TopicChanges:
    """Per topic queue, the event count of its last change, most recent last (events come on the
    loop: no lock)."""

    def __init__(self) -> None:
        self.epoch = secrets.token_hex(6)
        self._seq = 0
        self._changed: OrderedDict[str, int] = OrderedDict()
        self._forgotten = 0  # changes up to this count are no longer all remembered
        self._listening = False

    def cursor(self, listen: Listen) -> str:
        """The cursor of now (listening from now on, if not yet)."""
        if not self._listening:
            listen(self._on_events)
            self._listening = True
        return f"{self.epoch}:{self._seq}"

    def _on_events(self, events: dict[str, int]) -> None:
        self._seq += 1
        changed = self._changed
        for queue in events:
            if queue.startswith(TOPIC_QUEUE_PREFIX) or queue in HELD_QUEUES:
                changed[queue] = self._seq
                changed.move_to_end(queue)
        while len(changed) > MAX_TRACKED:  # (queues removed long ago, mostly)
            _, self._forgotten = changed.popitem(last=False)

    def since(self, cursor: str) -> list[str] | None:
        """The topic queues changed after ``cursor``, sorted; None when the cursor is not one of
        this gateway's since it listens (the reader must list everything)."""
        epoch, _, seq = cursor.partition(":")
        if not self._listening or epoch != self.epoch or not seq.isdigit() or int(seq) > self._seq:
            return None
        if int(seq) < self._forgotten:
            return None
        after = int(seq)
        found = []
        for queue in reversed(self._changed):  # newest first: stop at the first one not newer
            if self._changed[queue] <= after:
                break
            found.append(queue)
        return sorted(found)
