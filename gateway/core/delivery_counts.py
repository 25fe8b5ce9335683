"""How often each message of a consumer group was given back (a delivery limit's count, as
RabbitMQ's quorum queues keep it): only messages given back at least once have a count, kept
in memory and in a store table, so that a restart or a crash of the process keeps it. A write
the table refuses (a full disk: the store logs it) leaves the count in memory only: the message
is given back all the same, and a crash then can only make it come more often."""

from __future__ import annotations

from store import KvTable

from store import StoreError

TABLE = "core.delivery_counts"  # "{group}\x00{offset:020d}" -> times given back


class DeliveryCounts:
    def __init__(self, table: KvTable, group: str, *, restored: bool, committed: int) -> None:
        """The counts of ``group``: those saved (``restored``: the group existed before this
        run; counts of messages below ``committed`` are settled and dropped), or none (a new
        group: what an earlier group of the same name left is not its)."""
        self._table = table
        self._prefix = group + "\x00"
        self._counts: dict[int, int] = {}
        for key, raw in list(table.items(self._prefix)):
            rest = key[len(self._prefix):]
            if len(rest) != 20 or not rest.isdigit():
                continue  # another group's, whose name goes on from this one's and a NUL
            offset = int(rest)
            if restored and offset >= committed:
                self._counts[offset] = int(raw)
            else:
                table.delete(key)

    def __bool__(self) -> bool:
        return bool(self._counts)

    def count(self, offset: int) -> int:
        """How often the message at ``offset`` was given back so far."""
        return self._counts.get(offset, 0)

    def given_back(self, offset: int) -> int:
        """The message at ``offset`` was given back: how often now."""
        count = self._counts.get(offset, 0) + 1
        self._counts[offset] = count
        try:
            self._table.put_hint(self._key(offset), str(count).encode())
        except StoreError:  # (counted in memory: see the module's docstring)
            pass
        return count

    def forget(self, offset: int) -> None:
        """The message is settled (acknowledged, dead-lettered, dropped)."""
        if self._counts.pop(offset, None) is not None:
            try:
                self._table.delete(self._key(offset))
            except StoreError:  # (a count left behind is dropped when the group is restored past it)
                pass

    def forget_below(self, offset: int) -> None:
        """Every message below ``offset`` is settled (a purge, the queue's head dropped)."""
        for old in [o for o in self._counts if o < offset]:
            self.forget(old)

    def clear(self) -> None:
        for offset in list(self._counts):
            self.forget(offset)

    def _key(self, offset: int) -> str:
        return f"{self._prefix}{offset:020d}"
