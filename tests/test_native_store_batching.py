"""Differential tests of the committer's compiled bookkeeping (store/write/batching.py) and of the
dispatcher (store/index/dispatcher.py): the C extension and the interpreted reference give the same
prepared messages, offsets, records, put results, index writes and notifications."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import Message

from .native_support import compiled, interpreted, outcome

BATCHING, DISPATCHER = "store.write.batching", "store.index.dispatcher"
QUEUES = [f"q{i}" for i in range(6)] + ["t:a/b", "w:a/+"]

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)
messages = st.builds(
    Message, text, st.binary(max_size=200),
    st.none() | st.dictionaries(text.filter(bool), text, max_size=3),
    st.none() | text, st.none() | text, st.integers(0, 1 << 45), st.none(),  # (born given: the clock differs)
    st.integers(0, 0xFFFF_FFFF),
)
puts = st.lists(st.lists(st.tuples(messages, st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3, unique=True)),
                         min_size=1, max_size=4), min_size=1, max_size=4)


def fields(p: Any) -> tuple:
    return (p.body, p.born, p.flag, p.index_keys, list(p.queues), p.size, p.slots, p.static, p.tag_hash, p.topic,
            p.key, p.raw_properties)


class QueueStates:
    """cached/resolve of the consume-queue index: a queue's packed (next offset, qid)."""

    def __init__(self, known: dict[str, int]) -> None:
        self.packed = {name: (offset << 32) | qid for qid, (name, offset) in enumerate(known.items())}

    def cached(self, name: str) -> int | None:
        return self.packed.get(name) if len(name) % 2 else None  # some come from the cache, some resolved

    def resolve(self, name: str) -> int:
        return self.packed.setdefault(name, len(self.packed))


def run_batching(module: Any, groups_in: list, known: dict[str, int]) -> Any:
    groups = []
    for group in groups_in:
        prepared = []
        for message, queues in group:
            got = outcome(module.PreparedMessage, message, queues, 4096)
            if got[0] == "error":
                return got
            prepared.append(got[1])
        groups.append(prepared)
    states = QueueStates(known)
    records, placed, assigned = module.place(groups, states.cached, states.resolve, 1_700_000_000_000)
    positions = list(range(1000, 1000 + 10_000 * len(records), 10_000))
    return ([[fields(p) for p in g] for g in groups], records, [(t, o) for _, t, o in placed], assigned,
            module.put_results(groups, positions, placed, "AB", 7), module.dispatch_items(positions, placed, 7))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(groups=puts, known=st.dictionaries(st.sampled_from(QUEUES), st.integers(0, 1 << 31), max_size=4))
def test_prepared_messages_offsets_records_and_results_are_the_same(groups: list, known: dict[str, int]) -> None:
    fast, reference = compiled(BATCHING), interpreted(BATCHING)
    assert run_batching(fast, groups, known) == run_batching(reference, groups, known)


@given(message=messages, queues=st.lists(st.sampled_from(QUEUES), max_size=2), max_size=st.integers(0, 400))
def test_refusals_are_the_same(message: Message, queues: list[str], max_size: int) -> None:
    fast, reference = compiled(BATCHING), interpreted(BATCHING)
    mine, theirs = outcome(fast.PreparedMessage, message, queues, max_size), \
        outcome(reference.PreparedMessage, message, queues, max_size)
    assert mine[0] == theirs[0]
    assert (fields(mine[1]) if mine[0] == "value" else mine[1]) == (fields(theirs[1]) if theirs[0] == "value"
                                                                   else theirs[1])


class Recorder:
    """The index and notify hub a Dispatcher writes to, recording every call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.cache = self
        self.active = True

    def new_batch(self) -> Recorder:
        return self

    def put(self, key: bytes, value: bytes) -> None:
        self.calls.append(("put", key, value))

    def commit(self, batch: Any, end: int) -> None:
        self.calls.append(("commit", end))

    def update(self, heads: dict[str, int]) -> None:
        self.calls.append(("heads", dict(heads)))

    def trim_cache(self) -> None:
        self.calls.append(("trim",))

    def publish(self, events: dict[str, int]) -> None:
        self.calls.append(("notify", dict(events)))


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(groups=puts, known=st.dictionaries(st.sampled_from(QUEUES), st.integers(0, 1 << 31), max_size=4),
       recovering=st.booleans())
def test_the_dispatcher_writes_and_notifies_the_same(groups: list, known: dict[str, int], recovering: bool) -> None:
    reference = interpreted(BATCHING)
    result = run_batching(reference, groups, known)
    if result[0] == "error":
        return
    items, assigned = result[5], result[3]
    recorded = []
    for module in (compiled(DISPATCHER), interpreted(DISPATCHER)):
        recorder = Recorder()
        module.Dispatcher(recorder, recorder).dispatch(items, 123456, None if recovering else assigned)
        recorded.append(recorder.calls)
    assert recorded[0] == recorded[1]


@given(prefix=st.text(alphabet="0123456789ABCDEF", max_size=16), position=st.integers(0, (1 << 63) - 1),
       size=st.integers(0, 1 << 32), ts=st.integers(0, 1 << 45),
       offsets=st.dictionaries(st.sampled_from(QUEUES), st.integers(0, 1 << 40), min_size=1, max_size=3))
def test_put_results_read_the_same(prefix: str, position: int, size: int, ts: int, offsets: dict[str, int]) -> None:
    """store/messages/put_result.py: the message id (formatted when read), the fields, equality and repr."""
    built = [module.PutResult(prefix, position, size, ts, dict(offsets))
             for module in (compiled("store.messages.put_result"), interpreted("store.messages.put_result"))]
    seen = [(r.msg_id, r.position, r.size, r.store_timestamp, r.queue_offsets, repr(r)) for r in built]
    assert seen[0] == seen[1]
    assert seen[0][0] == f"{prefix}{position:016X}"
    assert built[0] == compiled("store.messages.put_result").PutResult(prefix, position, size, ts, dict(offsets))
    assert built[0] != compiled("store.messages.put_result").PutResult(prefix, position + 1, size, ts, dict(offsets))


@given(groups=puts)
def test_put_results_are_a_sequence_read_when_asked(groups: list) -> None:
    """store/write/batching.py PutResults: each put's results, built when read, index, slice, iterate
    and compare as the list of PutResult they stand for, in both builds."""
    for module in (compiled(BATCHING), interpreted(BATCHING)):
        prepared = [[module.PreparedMessage(m, q, 4096) for m, q in group] for group in groups]
        states = QueueStates({})
        _, placed, _ = module.place(prepared, states.cached, states.resolve, 5)
        positions = list(range(0, 1000 * len(placed), 1000))
        out = module.put_results(prepared, positions, placed, "AB", 5)
        at = 0
        for group, results in zip(groups, out):
            as_list = list(results)
            assert len(results) == len(group) == len(as_list)
            assert results == as_list and as_list == list(results[:]) and results[-1] == as_list[-1]
            assert [r.position for r in results] == positions[at:at + len(group)]
            assert [r.queue_offsets for r in as_list] == [dict(zip(q, placed[at + i][2])) for i, (_, q) in enumerate(group)]
            assert repr(results) == repr(as_list)
            at += len(group)
        try:
            out[0][len(groups[0])]
        except IndexError:
            pass
        else:
            raise AssertionError("an index past the end must raise IndexError")


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(groups=puts, following=st.sets(st.sampled_from(QUEUES)))
def test_messages_built_from_put_receipts_are_the_same(groups: list, following: set[str]) -> None:
    """receipt_tails (a gateway node's own messages for its queue cache): the same messages built
    from the same receipts, fields and all, in both builds."""
    fast, reference = compiled(BATCHING), interpreted(BATCHING)
    items = [item for group in groups for item in group]
    put_result = compiled("store.messages.put_result").PutResult
    sizes = [outcome(fast.PreparedMessage, message, queues, 1 << 20) for message, queues in items]
    receipts = [put_result("AB", 1000 + 100 * i, size[1].size if size[0] == "value" else 0, 7,
                           {queue: i for queue in queues}) for i, ((_, queues), size) in enumerate(zip(items, sizes))]

    def seen(module: Any) -> dict:
        return {queue: [(m, m.msg_id, m.properties, m.queues) for m in tail]
                for queue, tail in module.receipt_tails(items, receipts, following).items()}
    mine, theirs = seen(fast), seen(reference)
    assert mine == theirs
    built = sum(len(tail) for tail in mine.values())
    assert built == sum(1 for message, queues in items for q in queues if q in following)  # (born given: all built)
