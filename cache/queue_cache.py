"""QueueCache: a window of each queue's recent messages, shared by every reader on this node.

A thousand subscribers of one hot queue cost one store read per batch, not a thousand: the
first reader to reach a window's end reads the store once and appends; the rest read memory.
A source that answers later (a gateway node's store link) hands its answer to ``offer``; the
read at that offset takes it (see ``QueueCache.offer``). The local store writes through: the
messages it commits to a queue whose window ends at the queue's end are appended as committed
(``take_tail``), so readers at the tail never read them back. The cache hears the source's
notify events itself (``listen_notify``), before any reader is woken by them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from store import GetResult, GetStatus, StoredMessage

from .window import WINDOW_OVERHEAD, Window, message_cost

# Memory an offered answer costs beyond its messages: its record, result and list, dict entry.
ANSWER_OVERHEAD = 256

_COMPACT_AT = 64  # dropped head slots tolerated before the list is compacted


class MessageSource(Protocol):
    """What the cache needs from the store: ``store.MessageStore`` is one. A source that cannot
    answer at once (a gateway node's store link) says NO_NEW_MESSAGE, gives its answer to
    ``QueueCache.offer`` when it has it, then notifies the queue."""

    def get_now(self, queue: str, offset: int, max_messages: int = 32, max_bytes: int = 4 << 20) -> GetResult: ...


@dataclass(slots=True)
class CacheStats:
    """Counters (hits/misses count messages served; store_reads counts ``get_now`` calls) and gauges."""

    hits: int = 0
    misses: int = 0
    store_reads: int = 0
    messages_from_store: int = 0
    messages_written_through: int = 0  # handed in by the store as committed (take_tail)
    evictions: int = 0  # whole windows evicted to stay within max_bytes
    bytes: int = 0  # gauge: accounted memory of every window
    queues: int = 0  # gauge: windows held

    @property
    def hit_ratio(self) -> float:
        served = self.hits + self.misses
        return self.hits / served if served else 0.0


class _Answer:
    """A source's late answer to the read at one offset, until that read takes it."""

    __slots__ = ("cost", "result", "wake")

    def __init__(self, result: GetResult, cost: int, wake: int) -> None:
        self.result = result
        self.cost = cost
        self.wake = wake  # the window's ``wakes`` when offered


class QueueCache:
    """Serves ``(queue, offset)`` reads from per-queue windows, reading the store only for what it lacks.

    Bounded per queue by ``window_messages`` (oldest dropped first) and in total by ``max_bytes``
    (whole windows evicted, least recently read first). ``window_messages`` is also how far the
    store writes through ahead of a queue's readers: a subscriber a saturated broker feeds lags
    ~9,000 messages at 60,000 msgs/s (MQTT fan-in, measured), which 4,096 did not cover. Synchronous on purpose: a read never
    awaits, so concurrent reader tasks cannot interleave inside it. Messages are shared between
    readers and must be treated as read-only.
    """

    def __init__(self, store: MessageSource, max_bytes: int = 64 << 20, window_messages: int = 16384) -> None:
        if max_bytes < 0 or window_messages < 1:
            raise ValueError("max_bytes must be >= 0 and window_messages >= 1")
        self._store = store
        self.max_bytes = max_bytes
        self.window_messages = window_messages
        self._windows: OrderedDict[str, Window] = OrderedDict()  # least recently read first
        self._answers: OrderedDict[tuple[str, int], _Answer] = OrderedDict()  # (queue, offset), oldest first
        self.stats = CacheStats()
        # Queues whose window ends where the queue ends (as the last store read said): the
        # local store hands this cache what it commits to them (store/read/tail.py, ``take_tail``).
        self.following: set[str] = set()
        add_tail_reader = getattr(store, "add_tail_reader", None)  # the local store has it; a store link not
        if add_tail_reader is not None:
            add_tail_reader(self)
        # The cache hears every notify event itself, before any reader is woken by it: no
        # protocol's notify handler has to remember to tell it (``on_notify``'s contract).
        listen_notify = getattr(store, "listen_notify", None)
        self._hears_notify = listen_notify is not None
        if listen_notify is not None:
            listen_notify(self._notified)

    def close(self) -> None:
        """Stop hearing the store (a store node's cache ends with each spell of leading, while
        its store goes on): neither its commits' tails nor its notify events reach this cache."""
        remove_tail_reader = getattr(self._store, "remove_tail_reader", None)
        if remove_tail_reader is not None:
            remove_tail_reader(self)
        unlisten_notify = getattr(self._store, "unlisten_notify", None)
        if unlisten_notify is not None:
            unlisten_notify(self._notified)

    # -- reading -------------------------------------------------------------------------------
    def read(self, queue: str, offset: int, max_messages: int = 32, max_bytes: int = 4 << 20) -> GetResult:
        """Read like ``MessageStore.get_now``: up to ``max_messages``, at least one, then within ``max_bytes``.

        Statuses mean what the store's mean; NO_NEW_MESSAGE, OFFSET_TOO_SMALL, OFFSET_OVERFLOW and
        NO_SUCH_QUEUE are the store's own results. A FOUND batch is cut short of the caller's limits
        only when the cache knows the queue ends there. ``min_offset``/``max_offset`` of a result
        served from memory are as of the last store read or notify.
        """
        window = self._windows.get(queue)
        if window is not None:
            window.read_wakes = window.wakes  # (answers offered before the last wake were offered to this read)
        if max_messages < 1:
            return self._bypass(queue, window, offset, max_messages, max_bytes)
        if window is None or window.start < 0 or (offset > window.end and window.empty):
            return self._fill(queue, window, offset, max_messages, max_bytes)
        if offset < window.start or offset > window.end:
            # A lagging (or skipping) reader: served from the store, never cached, so that one slow
            # client does not pull the window off the tail that every other subscriber reads.
            return self._bypass(queue, window, offset, max_messages, max_bytes)
        return self._serve(queue, window, offset, max_messages, max_bytes)

    def _serve(self, queue: str, window: Window, offset: int, max_messages: int, max_bytes: int) -> GetResult:
        self._windows.move_to_end(queue)
        messages = window.messages
        first = window.head + offset - window.start
        stop = min(len(messages), first + max_messages)
        total = 0
        i = first
        while i < stop:
            size = messages[i].size
            if i > first and total + size > max_bytes:
                break
            total += size
            i += 1
        served = messages[first:i]
        stats = self.stats
        if i < len(messages) or len(served) == max_messages or (window.notified and window.max_offset <= window.end):
            # the caller's limits were reached, or the queue certainly ends at the window's end
            stats.hits += len(served)
            if served:
                window.served = max(window.served, i - first + offset)
                return GetResult(GetStatus.FOUND, served, i - first + offset, window.min_offset,
                                 max(window.max_offset, window.end))
            return GetResult(GetStatus.NO_NEW_MESSAGE, [], offset, window.min_offset, offset)

        # The window ran out and the store may have more: read it once from the window's end.
        end = window.end
        result = self._store_read(queue, end, max_messages, max_bytes)
        status = result.status
        if status is GetStatus.FOUND or status is GetStatus.NO_NEW_MESSAGE:
            fetched = result.messages
            self._append(window, fetched)
            if self._learn(queue, window, result):
                self._bound(queue, window)
            kept = self._windows.get(queue) is window
            if result.min_offset > offset:
                # Retention removed what this reader asked for since the window got it: the store's answer.
                return self._bypass(queue, window if kept else None, offset, max_messages, max_bytes)
            count = len(served)
            taken = 0
            for message in fetched:
                if count + taken == max_messages or (count + taken and total + message.size > max_bytes):
                    break
                total += message.size
                taken += 1
            stats.hits += count
            stats.misses += taken
            if kept:
                if window.end == result.max_offset:
                    self.following.add(queue)  # the readers are at the queue's end
                window.served = max(window.served, offset + count + taken)
            if not count + taken:
                return result  # NO_NEW_MESSAGE at the window's end: the store's own answer
            return GetResult(GetStatus.FOUND, served + fetched[:taken], offset + count + taken,
                             result.min_offset, max(result.max_offset, window.max_offset))
        # TOO_SMALL from the end: retention removed the whole window, and this reader's offset too
        # (the store's answer does not depend on the offset). OVERFLOW from the end, or no queue:
        # the queue was removed (and maybe re-created) under the window.
        self._remove(queue)
        if status is GetStatus.OFFSET_OVERFLOW and offset != end:
            return self._bypass(queue, None, offset, max_messages, max_bytes)
        return result

    def _fill(self, queue: str, window: Window | None, offset: int, max_messages: int, max_bytes: int) -> GetResult:
        """Nothing cached for the queue (or an empty window behind the reader): read and place the window."""
        result = self._store_read(queue, offset, max_messages, max_bytes)
        status = result.status
        if status is GetStatus.NO_SUCH_QUEUE:
            if window is not None:
                self._remove(queue)
            return result
        self.stats.misses += len(result.messages)
        # Place the window where the reader is when the store gave messages from there, or
        # when the reader is at the queue's end (a window to wait at for new messages).
        if status is GetStatus.FOUND or status is GetStatus.NO_NEW_MESSAGE and offset == result.max_offset:
            if window is None:
                window = self._windows[queue] = self._new_window()
            else:
                self._windows.move_to_end(queue)
                self._reset(window)
            window.start = window.served = offset
            self._append(window, result.messages)
            if self._learn(queue, window, result):
                self._bound(queue, window)
                window.served = offset + len(result.messages)
                if window.end == result.max_offset and self._windows.get(queue) is window:
                    self.following.add(queue)  # the reader is at the queue's end
        elif window is not None:
            self._learn(queue, window, result)
        return result

    def _bypass(self, queue: str, window: Window | None, offset: int, max_messages: int, max_bytes: int) -> GetResult:
        """A store read that leaves the window as it is, but for what it teaches (retention, max)."""
        result = self._store_read(queue, offset, max_messages, max_bytes)
        self.stats.misses += len(result.messages)
        if window is not None:
            if result.status is GetStatus.NO_SUCH_QUEUE:
                self._remove(queue)
            else:
                self._learn(queue, window, result)
        return result

    def _store_read(self, queue: str, offset: int, max_messages: int, max_bytes: int) -> GetResult:
        answer = self._answers.pop((queue, offset), None) if self._answers and max_messages > 0 else None
        if answer is None:
            result = self._store.get_now(queue, offset, max_messages, max_bytes)
        else:
            result = self._take(queue, offset, answer, max_messages, max_bytes)
        self.stats.store_reads += 1
        self.stats.messages_from_store += len(result.messages)
        return result

    # -- messages the store hands in as committed (store/read/tail.py) -------------------------------
    def take_tail(self, queue: str, result: GetResult) -> None:
        """The messages the store just committed to ``queue``, a queue in ``following``: appended
        as if a read at the window's end had returned them, when they continue the window and
        leave at most ``window_messages`` of it unread; otherwise the queue is no longer followed
        (the next read at the window's end reads the store, and follows it again if at the end).
        Not written through beyond that: a window no reader keeps up with would slide away from
        its readers, each message built for nothing. Nor at the cost of another window: over
        ``max_bytes``, the window's own head that was read goes first, and if that is not enough
        the messages are not taken (evicting the windows about to be read, least recently read
        first, made a fan-out to 100 queues evict on every commit: measured 9 % more CPU)."""
        window = self._windows.get(queue)
        messages = result.messages
        if (window is None or window.start < 0 or window.end != messages[0].queue_offset
                or window.end + len(messages) - window.served > self.window_messages):
            self.following.discard(queue)
            return
        self._append(window, messages)
        if not self._learn(queue, window, result):
            return
        over = self.stats.bytes - self.max_bytes
        if over > 0:
            costs, head = window.costs, window.head
            read = max(0, min(window.served - window.start, len(window.messages) - head - len(messages)))
            drop = bisect_left(costs, costs[head] + over, head, head + read + 1) - head
            if drop > read:
                self._untail(window, len(messages))
                self.following.discard(queue)
                return
            self._drop_head(window, drop)
        self.stats.messages_written_through += len(messages)
        self._bound(queue, window)

    # -- answers of a source that answers later ----------------------------------------------------
    def offer(self, queue: str, offset: int, result: GetResult) -> None:
        """The source's answer to a read of ``queue`` at ``offset`` that it could not answer at once.

        The next read at ``offset`` takes it, as if the source had answered then: into the
        window when it continues the window, around it for a reader behind (the window stays
        on the tail). An answer counts against ``max_bytes``; it is kept until its reader had
        its chance -- its queue's readers were woken (``on_notify``) and the queue read since,
        or woken twice (their pump runs between two wakes; a reader with no room does not
        read) -- and only then evicted, by a later offer, oldest first, before any window:
        evicted earlier, a small bound could starve that reader (every answer evicted before
        its read); kept longer, a reader with no room would hold every part of its queue the
        store link fetches meanwhile.
        """
        window = self._windows.get(queue)
        if window is None:
            window = self._windows[queue] = self._new_window()
        else:
            self._windows.move_to_end(queue)  # about to be read
        self._hold(queue, window, offset, result)
        # Only here, never in a read: the readers one notify wakes read one after another, and
        # the first one's read must not evict what the next one's read is to take.
        self._shed_answers()
        self._bound(None, None)

    def _hold(self, queue: str, window: Window, offset: int, result: GetResult) -> None:
        key = (queue, offset)
        old = self._answers.pop(key, None)
        if old is not None:
            self._forget_answer(window, old)
        cost = ANSWER_OVERHEAD
        for message in result.messages:
            cost += message_cost(message)
        self._answers[key] = _Answer(result, cost, window.wakes)
        window.answers += 1
        self.stats.bytes += cost

    def _take(self, queue: str, offset: int, answer: _Answer, max_messages: int, max_bytes: int) -> GetResult:
        """An offered answer, within the reader's limits (the rest is held for its next read), and
        with the queue's end as known now: a notify handled since the answer may have moved it."""
        window = self._windows[queue]
        self._forget_answer(window, answer)
        result = answer.result
        messages = result.messages
        n = 1
        total = messages[0].size if messages else 0
        while n < len(messages) and n < max_messages and total + messages[n].size <= max_bytes:
            total += messages[n].size
            n += 1
        if n < len(messages):
            rest = GetResult(GetStatus.FOUND, messages[n:], result.next_offset, result.min_offset, result.max_offset)
            self._hold(queue, window, messages[n].queue_offset, rest)
            result = GetResult(GetStatus.FOUND, messages[:n], messages[n].queue_offset, result.min_offset,
                               result.max_offset)
        result.max_offset = max(result.max_offset, window.max_offset)
        return result

    def _forget_answer(self, window: Window, answer: _Answer) -> None:
        window.answers -= 1
        self.stats.bytes -= answer.cost

    def _shed_answers(self) -> None:
        """Evict answers whose reader had its chance, oldest first, until within ``max_bytes``."""
        answers = self._answers
        if self.stats.bytes <= self.max_bytes or not answers:
            return
        for key in list(answers):
            if self.stats.bytes <= self.max_bytes:
                return
            answer = answers[key]
            window = self._windows[key[0]]
            # read since a wake that came after it, or woken twice since: the readers' pump ran
            # (between two wakes of a queue) and this answer's reader did not take it
            if window.read_wakes > answer.wake or window.wakes > answer.wake + 1:
                del answers[key]
                self._forget_answer(window, answer)

    # -- notify and removal ----------------------------------------------------------------------
    def on_notify(self, queue: str, max_offset: int) -> None:
        """Record that ``queue`` now ends at ``max_offset``; reads the store later, lazily, if at all.

        Contract: once called for a queue, it is called for every later notify event of that
        queue (before the queue's readers are woken) until ``drop(queue)``; the cache then
        answers "nothing new" at the known end without a store read. The cache's own listener
        of the source's notify events keeps it (``_notified``).
        """
        window = self._windows.get(queue)
        if window is None:
            # A queue nobody here has read yet: a bare record of the notify, put where eviction
            # looks first, so that notify broadcasts for queues without local readers cannot push
            # out windows that are being read.
            window = self._windows[queue] = Window()
            self._windows.move_to_end(queue, last=False)
            self.stats.queues += 1
            self.stats.bytes += WINDOW_OVERHEAD
            self._bound(None, None)
        window.max_offset = max(window.max_offset, max_offset)
        window.notified = True
        window.wakes += 1

    def _notified(self, events: dict[str, int]) -> None:
        """The source's notify events as it publishes them: each queue with a window learns its
        new end (a queue no one here reads has none, and needs none)."""
        windows = self._windows
        for queue, max_offset in events.items():
            if queue in windows:
                self.on_notify(queue, max_offset)

    def drop(self, queue: str) -> None:
        """Forget a queue (removed, or no local subscriber left)."""
        self._remove(queue)

    def clear(self) -> None:
        """Forget every queue; the counters keep counting."""
        self._windows.clear()
        self._answers.clear()
        self.following.clear()
        self.stats.bytes = 0
        self.stats.queues = 0

    def window(self, queue: str) -> tuple[int, int] | None:
        """The offsets [start, end) cached for ``queue``; None when no read has placed a window."""
        window = self._windows.get(queue)
        if window is None or window.start < 0:
            return None
        return window.start, window.end

    # -- window upkeep ---------------------------------------------------------------------------
    def _append(self, window: Window, messages: list[StoredMessage]) -> None:
        costs = window.costs
        start = total = costs[-1]
        append = costs.append
        for message in messages:
            total += message_cost(message)
            append(total)
        window.messages.extend(messages)
        window.bytes += total - start
        self.stats.bytes += total - start

    def _learn(self, queue: str, window: Window, result: GetResult) -> bool:
        """Take in a store result's bounds (a higher max; a minimum retention raised); False if the window went."""
        window.max_offset = max(window.max_offset, result.max_offset)
        low = result.min_offset
        window.min_offset = low
        if window.start >= 0 and low > window.start:
            if low >= window.end:
                self._remove(queue)  # retention removed everything the window held
                return False
            self._drop_head(window, low - window.start)
        return True

    def _bound(self, queue: str | None, window: Window | None) -> None:
        """Apply the per-queue bound to ``window``, then the byte bound to the whole cache."""
        if window is not None:
            excess = len(window.messages) - window.head - self.window_messages
            if excess > 0:
                self._drop_head(window, excess)
        stats = self.stats
        windows = self._windows
        kept = 0  # windows passed over: they hold answers still owed (the loop ends when all were)
        while stats.bytes > self.max_bytes and len(windows) > kept:
            oldest, held = next(iter(windows.items()))
            if oldest == queue and window is not None and not window.empty:
                # Only the window being read is left (but for windows owed answers) and it alone is
                # too big: keep its newest part.
                self._drop_head(window, 1)
                continue
            if held.answers:
                if held.start >= 0:  # its messages go; the record stays with its answers
                    self._reset(held)
                    held.start = -1
                    stats.evictions += 1
                windows.move_to_end(oldest)
                kept += 1
                continue
            self._remove(oldest)
            stats.evictions += 1

    def _drop_head(self, window: Window, count: int) -> None:
        messages = window.messages
        costs = window.costs
        head = window.head
        freed = costs[head + count] - costs[head]
        head += count
        if head >= _COMPACT_AT and head * 2 >= len(messages):
            del messages[:head]
            del costs[:head]
            head = 0
        window.head = head
        window.start += count
        window.bytes -= freed
        self.stats.bytes -= freed

    def _untail(self, window: Window, count: int) -> None:
        costs = window.costs
        freed = costs[-1] - costs[-1 - count]
        del window.messages[-count:]
        del costs[-count:]
        window.bytes -= freed
        self.stats.bytes -= freed

    def _new_window(self) -> Window:
        """A window for a queue read here. When the cache hears every notify event itself, its
        end is trusted from the start: every later growth of the queue will be heard."""
        window = Window()
        window.notified = self._hears_notify
        self.stats.queues += 1
        self.stats.bytes += WINDOW_OVERHEAD
        return window

    def _reset(self, window: Window) -> None:
        # (a reset window is re-placed, or left unplaced: ``take_tail`` checks where it ends)
        freed = window.bytes - WINDOW_OVERHEAD
        window.messages = []
        window.costs = [0]
        window.head = 0
        window.bytes = WINDOW_OVERHEAD
        self.stats.bytes -= freed

    def _remove(self, queue: str) -> None:
        window = self._windows.pop(queue, None)
        if window is None:
            return
        self.following.discard(queue)
        self.stats.bytes -= window.bytes
        self.stats.queues -= 1
        if window.answers:  # (answers for offsets of a queue removed, or re-created, would mislead)
            for key in [key for key in self._answers if key[0] == queue]:
                self._forget_answer(window, self._answers.pop(key))
