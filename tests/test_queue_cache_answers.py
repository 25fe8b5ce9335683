"""QueueCache over a source that answers later (a gateway node's store link): the answer offered
for a read is served once, by that read, inside or around the window; answers count against the
memory bound and are kept until their reader had its chance, however small the bound."""

from __future__ import annotations

from cache import ANSWER_OVERHEAD, WINDOW_OVERHEAD, QueueCache, message_cost
from store import GetResult, GetStatus, Message


class LateSource:
    """Answers every read "nothing yet" and records it; ``answer`` reads the real store and offers
    the result to the cache, as the store link does when the store node's answer is back."""

    def __init__(self, store) -> None:
        self.store = store
        self.asked: list[tuple[str, int]] = []
        self.cache: QueueCache | None = None

    def get_now(self, queue: str, offset: int, max_messages: int = 32, max_bytes: int = 4 << 20) -> GetResult:
        self.asked.append((queue, offset))
        return GetResult(GetStatus.NO_NEW_MESSAGE, [], offset, 0, offset)

    def answer(self, queue: str, offset: int, max_messages: int = 64) -> GetResult:
        assert self.cache is not None
        result = self.store.get_now(queue, offset, max_messages)
        self.cache.offer(queue, offset, result)
        self.cache.on_notify(queue, result.max_offset)  # the notify that follows the answer
        return result


async def put(store, queue: str, n: int) -> None:
    for i in range(n):
        await store.put(Message(f"t/{queue}", f"{queue}:{i}".encode()), [queue])


def cached_late(store, **limits) -> tuple[QueueCache, LateSource]:
    source = LateSource(store)
    cache = source.cache = QueueCache(source, **limits)
    return cache, source


def bodies(result: GetResult) -> list[bytes]:
    return [m.body for m in result.messages]


async def test_an_answer_is_served_once_by_the_read_at_its_offset_and_then_from_the_window(open_store):
    store = await open_store()
    await put(store, "q", 10)
    cache, source = cached_late(store)
    assert cache.read("q", 0).status is GetStatus.NO_NEW_MESSAGE  # not here yet
    assert source.asked == [("q", 0)]
    source.answer("q", 0)
    first = cache.read("q", 0)
    assert first.status is GetStatus.FOUND and bodies(first) == [f"q:{i}".encode() for i in range(10)]
    assert cache.window("q") == (0, 10)  # the answer placed the window
    assert cache.read("q", 0) == first  # a second reader: from the window, the source not asked
    assert source.asked == [("q", 0)]
    assert cache.stats.bytes == WINDOW_OVERHEAD + sum(message_cost(m) for m in first.messages)


async def test_a_reader_behind_the_window_takes_its_answer_around_it(open_store):
    store = await open_store()
    await put(store, "q", 100)
    cache, source = cached_late(store)
    cache.read("q", 90)
    source.answer("q", 90)
    assert bodies(cache.read("q", 90)) == [f"q:{i}".encode() for i in range(90, 100)]
    assert cache.window("q") == (90, 100)

    assert cache.read("q", 5, 10).status is GetStatus.NO_NEW_MESSAGE  # a session catching up
    assert source.asked[-1] == ("q", 5)
    source.answer("q", 5)  # 64 messages: more than this reader takes at a time
    assert cache.window("q") == (90, 100)  # the answer is not the window's
    taken = cache.read("q", 5, 10)
    assert bodies(taken) == [f"q:{i}".encode() for i in range(5, 15)] and taken.next_offset == 15
    assert bodies(cache.read("q", 15, 10))[0] == b"q:15"  # the rest of its answer, held for it
    asked = len(source.asked)
    assert cache.window("q") == (90, 100)  # the tail readers' window never moved
    assert cache.read("q", 5, 10).status is GetStatus.NO_NEW_MESSAGE  # served once: asked again
    assert len(source.asked) == asked + 1


async def test_an_answer_reports_the_queue_end_known_when_it_is_read(open_store):
    store = await open_store()
    await put(store, "q", 3)
    cache, source = cached_late(store)
    cache.read("q", 0)
    source.answer("q", 0)
    cache.on_notify("q", 7)  # published meanwhile: a reader stops at the end a read reports
    result = cache.read("q", 0)
    assert bodies(result) == [b"q:0", b"q:1", b"q:2"] and result.max_offset == 7


async def test_answers_are_kept_within_no_bound_until_their_reader_had_its_chance(open_store):
    """max_bytes=0 (cache off): every answer offered stays until its reader was woken and read,
    even when more answers come before the readers run; then it is the first thing evicted."""
    store = await open_store()
    queues = [f"q{i}" for i in range(5)]
    for queue in queues:
        await put(store, queue, 3)
    cache, source = cached_late(store, max_bytes=0)
    for queue in queues:
        cache.read(queue, 0)
    for queue in queues:  # every answer back before any reader runs
        source.answer(queue, 0)
    for queue in queues:
        assert bodies(cache.read(queue, 0)) == [f"{queue}:{i}".encode() for i in range(3)], queue
    assert cache.stats.bytes == 0 and cache.stats.queues == 0

    # an answer nobody took at the read after its wake (its reader left): evicted by the next answer
    cache.read("q0", 1)
    cache.read("q1", 0)
    source.answer("q0", 1)
    assert cache.stats.bytes > 0
    cache.read("q0", 2)  # another reader of q0, after the wake
    source.answer("q1", 0)
    assert bodies(cache.read("q1", 0))[0] == b"q1:0"
    asked = len(source.asked)
    assert cache.read("q0", 1).status is GetStatus.NO_NEW_MESSAGE and len(source.asked) == asked + 1
    assert cache.stats.bytes == 0


async def test_answers_count_against_the_bound_and_go_with_their_queue(open_store):
    store = await open_store()
    await put(store, "q", 4)
    cache, source = cached_late(store)
    cache.read("q", 0)
    cache.read("q", 2)
    answer = source.answer("q", 2)
    held = WINDOW_OVERHEAD + ANSWER_OVERHEAD + sum(message_cost(m) for m in answer.messages)
    assert cache.stats.bytes == held
    source.answer("q", 0)
    assert cache.stats.bytes > held
    cache.drop("q")  # no reader left here
    assert (cache.stats.bytes, cache.stats.queues) == (0, 0)
    assert cache.read("q", 2).status is GetStatus.NO_NEW_MESSAGE  # asked again
    source.answer("q", 2)
    cache.clear()  # the store link was lost
    assert cache.stats.bytes == 0
    assert cache.read("q", 2).status is GetStatus.NO_NEW_MESSAGE


async def test_windows_give_way_to_answers_still_owed(open_store):
    """Over the bound, windows of other queues go first; a queue with an answer still owed
    keeps its record (and the answer), whatever its place in the eviction order."""
    store = await open_store()
    for queue in ("a", "b", "c", "d"):
        await put(store, queue, 20)
    cache, source = cached_late(store, max_bytes=1 << 20)
    for queue in ("a", "b"):
        cache.read(queue, 0)
        source.answer(queue, 0)
        assert len(cache.read(queue, 0).messages) == 20
    cache.read("c", 0)
    source.answer("c", 0)  # owed to c's reader
    cache.max_bytes = 0  # (as if the windows had grown past the bound)
    cache.read("d", 0)
    source.answer("d", 0)  # an offer applies the bound
    assert cache.window("a") is None and cache.window("b") is None
    assert bodies(cache.read("c", 0))[0] == b"c:0"
    assert bodies(cache.read("d", 0))[0] == b"d:0"
    assert cache.stats.bytes == 0


async def test_a_reader_woken_with_others_of_its_queue_still_finds_its_answer(open_store):
    """The readers a notify wakes read one after another: the first one's read must not evict
    what was fetched for the next one (with a small bound, that one would starve: every round,
    its answer gone before its read)."""
    store = await open_store()
    await put(store, "q", 10)
    cache, source = cached_late(store, max_bytes=0)
    cache.read("q", 9)  # the tail reader
    source.answer("q", 9)
    assert cache.read("q", 10).status is GetStatus.NO_NEW_MESSAGE  # a reader at the end reads first
    assert bodies(cache.read("q", 9)) == [b"q:9"]


async def test_answers_for_a_queue_its_readers_do_not_read_are_shed_after_the_next_wake(open_store):
    """A reader with no room (its inflight window full) is woken but does not read, while the
    store link fetches each new part of the queue: what it fetched must not pile up beyond the
    bound. An answer is kept through the wake that follows it (the readers' pump runs before
    the next one), and is shed after the next."""
    store = await open_store()
    await put(store, "q", 50)
    cache, source = cached_late(store, max_bytes=0)
    for offset in range(0, 50, 10):  # a part fetched on each notify, nobody reading
        source.answer("q", offset, 10)
    assert cache.read("q", 40).next_offset == 50  # the newest two are still held
    assert cache.read("q", 30).next_offset == 40
    asked = len(source.asked)
    for offset in (20, 10, 0):
        assert cache.read("q", offset).status is GetStatus.NO_NEW_MESSAGE  # shed: asked again
    assert len(source.asked) == asked + 3
