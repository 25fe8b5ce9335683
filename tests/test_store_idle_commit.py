"""The store's side of a lone message's commit: a put of one message through ``put_each_nowait``
that finds the committer idle is committed before the call returns (its readers see it at once);
puts made in the same loop turn after a commit, puts of several messages, numbered puts and puts
made by a commit's own callbacks wait for the committer's turn, and the puts of one turn that
wait commit together, in order (the group commit is as before under load)."""

from __future__ import annotations

import asyncio

import pytest

from store import GetStatus, Message
from store.log.commitlog import CommitLog


def count_appends(monkeypatch) -> list[int]:
    """From now on, each commitlog append records how many records it wrote."""
    appends: list[int] = []
    real = CommitLog.append

    def append(self: CommitLog, records):  # type: ignore[no-untyped-def]
        appends.append(len(records))
        return real(self, records)

    monkeypatch.setattr(CommitLog, "append", append)
    return appends


@pytest.mark.parametrize("flush", ["async", "sync"])
async def test_a_lone_put_to_an_idle_store_is_committed_before_the_call_returns(open_store, monkeypatch, flush):
    store = await open_store(flush=flush)
    await asyncio.sleep(0.01)  # (no commit in this turn)
    appends = count_appends(monkeypatch)
    fut, refused = store.put_each_nowait([(Message("t", b"lone"), ["q"])])
    assert not refused and appends == [1]
    res = store.get_now("q", 0)  # readable now, in the caller's turn
    assert res.status is GetStatus.FOUND and [m.body for m in res.messages] == [b"lone"]
    assert (await asyncio.wait_for(fut, 5))[0].queue_offsets == {"q": 0}


async def test_puts_of_one_turn_after_a_commit_wait_and_commit_together_in_order(open_store, monkeypatch):
    store = await open_store(flush="sync")
    await asyncio.sleep(0.01)
    appends = count_appends(monkeypatch)
    futs = [store.put_each_nowait([(Message("t", b"%d" % i), ["q"])])[0] for i in range(4)]
    assert appends == [1]  # the first committed at once; the others wait for the committer
    assert store.get_now("q", 1).status is not GetStatus.FOUND
    results = await asyncio.wait_for(asyncio.gather(*futs), 5)
    assert appends == [1, 3]  # ... and commit together, in one write
    assert [r[0].queue_offsets for r in results] == [{"q": i} for i in range(4)]
    assert [m.body for m in store.get_now("q", 0).messages] == [b"0", b"1", b"2", b"3"]


async def test_a_put_of_several_messages_or_a_numbered_put_waits_for_the_committers_turn(open_store, monkeypatch):
    store = await open_store(flush="async")
    await asyncio.sleep(0.01)
    appends = count_appends(monkeypatch)
    fut, _ = store.put_each_nowait([(Message("t", b"a"), ["q"]), (Message("t", b"b"), ["q"])])
    assert appends == []
    await asyncio.wait_for(fut, 5)
    await asyncio.sleep(0.01)
    numbered, _ = store.put_numbered_nowait([(Message("t", b"c"), ["q"])], [(b"producer", 1)])
    assert appends == [2]  # (its mark is recorded after the submission: it waits)
    assert (await asyncio.wait_for(numbered, 5))[0].queue_offsets == {"q": 2}
    again = await asyncio.wait_for(store.put_batch_nowait([(Message("t", b"c"), ["q"])], producer=(b"producer", 1),
                                                          resent=True), 5)
    assert again[0].queue_offsets == {"q": 2}  # found by its mark: not stored twice
    assert appends == [2, 1]


async def test_a_put_made_by_a_commits_callbacks_waits_for_the_next_turn(open_store, monkeypatch):
    store = await open_store(flush="async")
    await asyncio.sleep(0.01)
    inner: list[asyncio.Future] = []

    def listener(events: dict[str, int]) -> None:
        if "q" in events and not inner:
            store.after_commit(lambda: inner.append(store.put_each_nowait([(Message("t", b"dead"), ["dlq"])])[0]))

    store.listen_notify(listener)
    appends = count_appends(monkeypatch)
    fut, _ = store.put_each_nowait([(Message("t", b"first"), ["q"])])
    assert appends == [1] and len(inner) == 1  # the callback's put waits: no commit inside a commit
    assert store.get_now("dlq", 0).status is not GetStatus.FOUND
    await asyncio.wait_for(asyncio.gather(fut, inner[0]), 5)
    assert appends == [1, 1]
