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
        self._loaded = False  # (those out before a restart: found once, by the first ordered pop)

    def blocked(self, group: str, queue: str, ordered: Ordered) -> bool:
        """Whether an ordered message of ``queue`` is out to a member of ``group`` now."""
        if not self._loaded:
            self._load(ordered)
        out = self._out.get((group, queue))
        if not out:
            return False
        for offset, due_ms in list(out.items()):
            if self.points.invisible(group, queue, offset, due_ms) is None:
                del out[offset]  # (acked, dead-lettered, or back in the ready set)
        if not out:
            del self._out[(group, queue)]
        return bool(out)

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

    def _load(self, ordered: Ordered) -> None:
        """The ordered messages out now, from the check points (one walk of them)."""
        self._loaded = True
        for cp in self.points.outstanding():
            if cp.due_ms:  # (invisible: out to a member; ready ones are served first anyway)
                message = self.store.read_at(cp.position)
                if message is not None and ordered(message):
                    self._out.setdefault((cp.group, cp.queue), {}).setdefault(cp.offset, cp.due_ms)
