"""Consumer offsets: where each reader of a queue resumes. Commits are kept in memory and
written by the store's periodic checkpoint (and at close) -- and, when ``soon`` is set, it is
told of the first commit since the last write, to write them shortly (a few a second, not one
write per ack); ``save`` writes one through at once (the meta store's WAL), for a reader's
start, which no crash may lose."""

from __future__ import annotations

from collections.abc import Callable

from .tables import MetaStore


class ConsumerOffsets:
    def __init__(self, meta: MetaStore) -> None:
        self._meta = meta
        self._dirty: dict[tuple[str, str], int] = {}
        self.soon: Callable[[], None] | None = None

    def commit(self, consumer: str, queue: str, offset: int) -> None:
        _check(offset)
        if not self._dirty and self.soon is not None:
            self.soon()
        self._dirty[(consumer, queue)] = offset

    def save(self, consumer: str, queue: str, offset: int) -> None:
        _check(offset)
        self._dirty.pop((consumer, queue), None)
        self._meta.save_offsets({(consumer, queue): offset})

    def forget_queues(self, queues: set[str], position: int) -> None:
        """Every consumer's offset of these queues, committed or written (queues removed by the
        drop records ending at ``position``: retention/reclaim.py)."""
        for key in [key for key in self._dirty if key[1] in queues]:
            del self._dirty[key]
        self._meta.delete_offsets_of(queues, position)

    def get(self, consumer: str, queue: str) -> int | None:
        offset = self._dirty.get((consumer, queue))
        return offset if offset is not None else self._meta.load_offset(consumer, queue)

    def checkpoint(self) -> None:
        if self._dirty:
            dirty, self._dirty = self._dirty, {}
            try:
                self._meta.save_offsets(dirty)
            except Exception:
                dirty.update(self._dirty)
                self._dirty = dirty
                raise


def _check(offset: int) -> None:
    if not 0 <= offset < 1 << 63:
        raise ValueError(f"a consumer offset is a non-negative 63-bit number, not {offset}")
