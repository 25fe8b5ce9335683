"""Ordered pops: a queue holding ordered messages (a message group's) is handed out to a
consumer group one stretch at a time -- while an ordered message of it is invisible (out to a
member, not acked), the group pops nothing more of that queue; one that comes back is served
again before anything after it. So two members never hold messages of one queue's order at once.

The ordered messages out are remembered by (offset, due time), and checked against the check
points (an ack or a revival ends them); after a restart a queue's are found again from the
check points the first time it is popped."""

from __future__ import annotations

from collections.abc import Callable

from store import CheckPoint, MessageStore, PopCheckPoints, StoredMessage

Ordered = Callable[[StoredMessage], bool]  # whether a message is one of an order (a message group's)


class OrderedOut:
    def __init__(self, store: MessageStore, points: PopCheckPoints) -> None:
        self.store = store
        self.points = points
        self._out: dict[tuple[str, str], dict[int, int]] = {}  # (group, queue) -> offset -> due ms

    def blocked(self, group: str, queue: str, ordered: Ordered) -> bool:
        """Whether an ordered message of ``queue`` is out to a member of ``group`` now."""
        out = self._out.get((group, queue))
        if out is None:
            out = self._out[(group, queue)] = self._found(group, queue, ordered)
        for offset, due_ms in list(out.items()):
            if self.points.invisible(group, queue, offset, due_ms) is None:
                del out[offset]  # (acked, dead-lettered, or back in the ready set)
        return bool(out)  # (an empty one stays: the queue's are known, no scan again)

    def holds(self, group: str, queue: str, offset: int) -> bool:
        """Whether the message at ``offset`` is an ordered one out (its end unblocks the queue)."""
        return offset in self._out.get((group, queue), ())

    def handed_out(self, cp: CheckPoint, due_ms: int) -> None:
        self._out.setdefault((cp.group, cp.queue), {})[cp.offset] = due_ms

    def changed(self, group: str, queue: str, offset: int, due_ms: int) -> None:
        """A message out got a new invisible time: it stays out until then."""
        out = self._out.get((group, queue))
        if out is not None and offset in out:
            out[offset] = due_ms

    def _found(self, group: str, queue: str, ordered: Ordered) -> dict[int, int]:
        """The ordered messages of (group, queue) out now, from the check points."""
        found = {}
        for cp in self.points.outstanding():
            if cp.group == group and cp.queue == queue and cp.due_ms:
                message = self.store.read_at(cp.position)
                if message is not None and ordered(message):
                    found[cp.offset] = cp.due_ms
        return found
