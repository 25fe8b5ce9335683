"""Pop consumption over the remoting protocol, through the Java client's wire exchange
(tests/pop_support.py): pop + ack, revive with the reconsume count, changed invisible time,
batch acks, the dead letter queue after the max reconsume times, message-level load
balancing of one queue over two consumers, long polling, refusals, and kill -9."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from pathlib import Path

import pytest

from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.message_codec import decode_messages

from .crash_support import free_port, kill9, seeded_random, start_gateway, stop
from .pop_support import PopClient, Popped
from .remoting_support import RawRemoting, pull_header, remoting_gateway, send_header
from .test_metrics import fetch, samples, value
from .test_trace import trace_until

TOPIC = "Jobs"
GROUP = "pop-workers"


async def send(raw: RawRemoting, bodies: list[bytes], queue_id: int = 0, topic: str = TOPIC) -> None:
    for body in bodies:
        response = await raw.call(RequestCode.SEND_MESSAGE, send_header(topic, queue_id), body)
        assert response.code == ResponseCode.SUCCESS, response.remark


async def pop_until(client: PopClient, count: int, timeout_s: float = 10.0, **kw) -> list[Popped]:
    """Pop (long-polled) until ``count`` messages came or ``timeout_s`` passed."""
    got: list[Popped] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += await client.pop(TOPIC, poll_ms=500, **kw)
    return got


async def test_popped_messages_are_invisible_and_an_ack_ends_them(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        client = await PopClient.open(addr, GROUP)
        await send(client.raw, [b"a", b"b", b"c"])
        popped = await client.pop(TOPIC, invisible_ms=400)
        assert [p.body for p in popped] == [b"a", b"b", b"c"]
        assert [p.message.reconsume_times for p in popped] == [0, 0, 0]
        assert [p.message.queue_offset for p in popped] == [0, 1, 2] and popped[0].message.topic == TOPIC
        assert client.last.ext_fields["restNum"] == "0"
        assert await client.pop(TOPIC) == [] and client.last.code == ResponseCode.POLLING_TIMEOUT  # all out
        for p in popped:
            assert (await client.ack(TOPIC, p)).code == ResponseCode.SUCCESS
        again = await client.ack(TOPIC, popped[0])
        assert again.code == ResponseCode.NO_MESSAGE and "acked already" in again.remark
        await asyncio.sleep(0.8)  # past the invisible time: nothing comes back
        assert await client.pop(TOPIC, poll_ms=300) == [] and gw.remoting.pop.outstanding() == []
        client.close()


async def test_a_message_not_acked_in_time_comes_back_with_its_reconsume_count(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        client = await PopClient.open(addr, GROUP)
        await send(client.raw, [b"x", b"y"])
        first = await client.pop(TOPIC, invisible_ms=300)
        assert (await client.ack(TOPIC, first[1])).code == ResponseCode.SUCCESS  # y done, x forgotten
        started = time.monotonic()
        back = await pop_until(client, 1, invisible_ms=300)
        assert time.monotonic() - started >= 0.2  # (not before its invisible time)
        assert [(p.body, p.message.reconsume_times, p.message.queue_offset) for p in back] == [(b"x", 1, 0)]
        late = await client.ack(TOPIC, first[0])  # the first pop's ack comes too late: the message came back
        assert late.code == ResponseCode.NO_MESSAGE
        assert (await client.ack(TOPIC, back[0])).code == ResponseCode.SUCCESS
        assert gw.remoting.pop.revived == 1 and gw.remoting.pop.outstanding() == []
        client.close()


async def test_change_invisible_time_moves_the_check_point(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        client = await PopClient.open(addr, GROUP)
        await send(client.raw, [b"slow", b"retry-soon"])
        slow, soon = await client.pop(TOPIC, invisible_ms=300)
        response, slow_info = await client.change(TOPIC, slow, 30_000)
        assert response.code == ResponseCode.SUCCESS and slow_info is not None
        assert int(response.ext_fields["invisibleTime"]) == 30_000
        _, soon_info = await client.change(TOPIC, soon, 50)
        back = await pop_until(client, 1, invisible_ms=30_000)
        assert [(p.body, p.message.reconsume_times) for p in back] == [(b"retry-soon", 1)]
        await asyncio.sleep(0.5)  # past the first invisible time of "slow": it stays out
        assert await client.pop(TOPIC) == []
        assert (await client.ack(TOPIC, slow)).code == ResponseCode.NO_MESSAGE  # its old extraInfo names nothing
        stale, _ = await client.change(TOPIC, soon_info, 1000)  # revived since: no longer out under that name
        assert stale.code == ResponseCode.NO_MESSAGE
        assert (await client.ack(TOPIC, slow_info)).code == ResponseCode.SUCCESS
        assert (await client.ack(TOPIC, back[0])).code == ResponseCode.SUCCESS
        assert gw.remoting.pop.outstanding() == []
        client.close()


async def test_batch_ack_acks_the_offsets_of_its_bit_set(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        client = await PopClient.open(addr, GROUP)
        await send(client.raw, [b"0", b"1", b"2", b"3"])
        popped = await client.pop(TOPIC, invisible_ms=300)
        response = await client.batch_ack(TOPIC, [popped[0], popped[1], popped[3]])
        assert response.code == ResponseCode.SUCCESS
        back = await pop_until(client, 1, invisible_ms=5000)
        assert [p.body for p in back] == [b"2"]
        assert (await client.batch_ack(TOPIC, popped[:1])).code == ResponseCode.NO_MESSAGE  # acked already
        bad = await client.raw.call(RequestCode.BATCH_ACK_MESSAGE, {}, b"{not json")
        assert bad.code == ResponseCode.INVALID_PARAMETER
        assert (await client.batch_ack(TOPIC, back)).code == ResponseCode.SUCCESS
        assert gw.remoting.pop.outstanding() == []
        client.close()


async def test_after_the_max_reconsume_times_a_message_goes_to_the_dlq(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, remoting_max_reconsume_times=2, metrics_bind="127.0.0.1:0") as (gw, addr):
        client = await PopClient.open(addr, GROUP)
        await send(client.raw, [b"poison"])
        seen = []
        deadline = time.monotonic() + 10
        while gw.remoting.pop.dead_lettered == 0 and time.monotonic() < deadline:
            seen += [p.message.reconsume_times for p in await client.pop(TOPIC, invisible_ms=100, poll_ms=200)]
        assert seen == [0, 1, 2]  # delivered, then came back twice: the third time it is a dead letter
        response = await client.raw.call(RequestCode.PULL_MESSAGE, dict(pull_header(f"%DLQ%{GROUP}", 0)))
        assert response.code == ResponseCode.SUCCESS, response.remark
        (dead,) = decode_messages(response.body)
        assert dead.body == b"poison" and dead.reconsume_times == 3 and dead.properties["RETRY_TOPIC"] == TOPIC
        assert await client.pop(TOPIC, poll_ms=300) == [] and gw.remoting.pop.outstanding() == []
        metrics = samples((await fetch("http://{}:{}".format(*gw.metrics_address), "/metrics"))[1])
        assert value(metrics, "tidemq_remoting_pop_revived_total") == 2
        assert value(metrics, "tidemq_remoting_pop_dead_lettered_total") == 1
        client.close()


async def test_two_consumers_popping_one_queue_get_disjoint_messages(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        one, two = await PopClient.open(addr, GROUP), await PopClient.open(addr, GROUP)
        bodies = [str(i).encode() for i in range(40)]
        await send(one.raw, bodies)  # all in queue 0: more consumers than queues is no limit
        got: dict[str, list[bytes]] = {"one": [], "two": []}

        async def consume(name: str, client: PopClient) -> None:
            deadline = time.monotonic() + 10
            while sum(map(len, got.values())) < len(bodies) and time.monotonic() < deadline:
                for p in await client.pop(TOPIC, max_nums=3, invisible_ms=30_000, poll_ms=100):
                    got[name].append(p.body)
                    assert (await client.ack(TOPIC, p)).code == ResponseCode.SUCCESS

        await asyncio.gather(consume("one", one), consume("two", two))
        assert got["one"] and got["two"]
        assert not set(got["one"]) & set(got["two"])
        assert sorted(got["one"] + got["two"], key=int) == bodies
        assert gw.remoting.pop.outstanding() == [] and gw.remoting.pop.revived == 0
        one.close()
        two.close()


async def test_a_held_pop_is_answered_when_a_message_arrives(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        client = await PopClient.open(addr, GROUP)
        producer = await RawRemoting.open(addr)
        await send(producer, [b"first"])
        assert len(await client.pop(TOPIC, queue_id=-1)) == 1  # queueId -1: every queue of the topic
        held = asyncio.create_task(client.pop(TOPIC, queue_id=-1, poll_ms=5000))
        await asyncio.sleep(0.3)
        assert not held.done()
        started = time.monotonic()
        await send(producer, [b"later"], queue_id=2)
        (p,) = await held
        assert p.body == b"later" and p.message.queue_id == 2 and time.monotonic() - started < 3
        assert p.extra_info.split(" ")[6] == "2" and (await client.ack(TOPIC, p)).code == ResponseCode.SUCCESS
        producer.close()
        client.close()


async def test_pop_refusals(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        client = await PopClient.open(addr, GROUP)
        await send(client.raw, [b"m"])
        for extra, code in (({"order": "true"}, ResponseCode.INVALID_PARAMETER),
                            ({"maxMsgNums": "33"}, ResponseCode.INVALID_PARAMETER),
                            ({"queueId": "9"}, ResponseCode.INVALID_PARAMETER),
                            ({"invisibleTime": "-1"}, ResponseCode.INVALID_PARAMETER),
                            ({"topic": "Nope"}, ResponseCode.TOPIC_NOT_EXIST),
                            ({"consumerGroup": "g" * 256}, ResponseCode.INVALID_PARAMETER),
                            ({"expType": "SQL92", "exp": "a >"}, ResponseCode.SUBSCRIPTION_PARSE_FAILED)):
            response = await client.request_pop(TOPIC, extra=extra)
            assert response.code == code, (extra, response.code, response.remark)
        for extra_info in ("x 1 2 0 0 tidemq 0 0", "0 -5 2 0 0 tidemq 0 0", "0 1 2 0 0 tidemq 0 -1"):
            bad = await client.ack(TOPIC, extra_info)
            assert bad.code == ResponseCode.INVALID_PARAMETER, (extra_info, bad.remark)
        huge = {"acks": [{"c": GROUP, "t": TOPIC, "r": "0", "so": 0, "q": 0, "rq": 0, "pt": 1, "it": 1,
                          "b": base64.b64encode(b"\xff" * 200).decode()}]}
        refused = await client.raw.call(RequestCode.BATCH_ACK_MESSAGE, {}, json.dumps(huge).encode())
        assert refused.code == ResponseCode.INVALID_PARAMETER and "bit set" in refused.remark
        far = dict(huge["acks"][0], b=base64.b64encode(bytes(100_000) + b"\x05").decode())  # offsets 800,000 and 800,002
        wide = await client.raw.call(RequestCode.BATCH_ACK_MESSAGE, {}, json.dumps({"acks": [far]}).encode())
        assert wide.code == ResponseCode.NO_MESSAGE and wide.remark.startswith("2 of 2 check points")
        peek = await client.raw.call(RequestCode.PEEK_MESSAGE, {"consumerGroup": GROUP, "topic": TOPIC})
        assert peek.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert len(await client.pop(TOPIC, invisible_ms=100)) == 1  # nothing refused took the message
        client.close()


async def test_a_tag_filter_passes_over_other_messages(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        client = await PopClient.open(addr, GROUP)
        for body, tag in ((b"a", "red"), (b"b", "blue"), (b"c", "red")):
            header = send_header(TOPIC, 0, properties=f"TAGS\x01{tag}")
            assert (await client.raw.call(RequestCode.SEND_MESSAGE, header, body)).code == ResponseCode.SUCCESS
        popped = await client.pop(TOPIC, exp="red")
        assert [p.body for p in popped] == [b"a", b"c"] and [p.message.queue_offset for p in popped] == [0, 2]
        assert client.last.ext_fields["msgOffsetInfo"] == "0 0 0,2"
        client.close()


async def test_popped_messages_survive_kill_9_acked_ones_stay_acked(data_dir: Path) -> None:
    port = free_port()
    proc = start_gateway(data_dir, remoting_port=port)
    try:
        client = await PopClient.open(f"127.0.0.1:{port}", GROUP)
        await send(client.raw, [b"acked", b"unacked", b"unread"])
        acked, _ = await client.pop(TOPIC, max_nums=2, invisible_ms=1500)  # the POP response came
        assert (await client.ack(TOPIC, acked)).code == ResponseCode.SUCCESS
        kill9(proc)
        proc = start_gateway(data_dir, remoting_port=port)
        client = await PopClient.open(f"127.0.0.1:{port}", GROUP)
        # the unread one (the pop offset survived too) and, its invisible time over, the unacked
        # one again -- in either order: a slow restart may outlast the invisible time
        got = await pop_until(client, 2, invisible_ms=60_000)
        assert sorted((p.body, p.message.reconsume_times) for p in got) == [(b"unacked", 1), (b"unread", 0)]
        assert await client.pop(TOPIC, poll_ms=1000) == []  # the acked one does not come back
        client.close()
    finally:
        stop(proc)


async def test_where_a_group_starts_popping_and_its_consumer_offset(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        newest = await PopClient.open(addr, "from-max")
        await send(newest.raw, [b"0", b"1", b"2"])
        assert [p.body for p in await newest.pop(TOPIC, init_mode=1)] == [b"2"]  # MAX: the last one there is
        switched = await PopClient.open(addr, "was-pulling")  # a group that pulled up to offset 1
        update = {"consumerGroup": "was-pulling", "topic": TOPIC, "queueId": "0", "commitOffset": "1"}
        assert (await switched.raw.call(RequestCode.UPDATE_CONSUMER_OFFSET, update)).code == ResponseCode.SUCCESS
        assert [p.body for p in await switched.pop(TOPIC, max_nums=1)] == [b"1"]
        query = {"consumerGroup": "was-pulling", "topic": TOPIC, "queueId": "0"}
        offset = await switched.raw.call(RequestCode.QUERY_CONSUMER_OFFSET, query)
        assert offset.ext_fields["offset"] == "2"  # (it follows the pops)
        newest.close()
        switched.close()


async def test_a_pop_of_every_queue_answers_one_entry_per_queue(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        client = await PopClient.open(addr, GROUP)
        for queue_id in range(4):
            await send(client.raw, [f"q{queue_id}".encode()] * 2, queue_id=queue_id)
        popped = await client.pop(TOPIC, queue_id=-1, max_nums=32)
        assert sorted(p.body for p in popped) == sorted(f"q{q}".encode() for q in range(4) for _ in range(2))
        assert len(client.last.ext_fields["msgOffsetInfo"].split(";")) == 4
        assert {p.extra_info.split(" ")[1] for p in popped} == {client.last.ext_fields["popTime"]}
        for p in popped:
            assert (await client.ack(TOPIC, p)).code == ResponseCode.SUCCESS
        assert gw.remoting.pop.outstanding() == []
        client.close()


@pytest.mark.slow
async def test_kill_9_while_two_consumers_pop_and_ack_loses_nothing_and_returns_no_acked_message(data_dir: Path) -> None:
    rng = seeded_random("pop random kill")
    port = free_port()
    proc = start_gateway(data_dir, remoting_port=port)
    bodies = {str(i).encode() for i in range(1000)}
    acked: set[bytes] = set()  # SUCCESS came back
    unsure: set[bytes] = set()  # ack sent, the kill came before its answer
    try:
        producer = await RawRemoting.open(f"127.0.0.1:{port}")
        for body in bodies:  # (pipelined)
            producer.send(RequestCode.SEND_MESSAGE, send_header(TOPIC, 0), body)
        assert all([(await producer.recv()).code == ResponseCode.SUCCESS for _ in bodies])

        async def consume(client: PopClient) -> None:
            with contextlib.suppress(ConnectionError, OSError, asyncio.IncompleteReadError):
                while True:
                    for p in await client.pop(TOPIC, max_nums=2, invisible_ms=1500):
                        unsure.add(p.body)
                        if (await client.ack(TOPIC, p)).code == ResponseCode.SUCCESS:
                            acked.add(p.body)
                        unsure.discard(p.body)

        consumers = [await PopClient.open(f"127.0.0.1:{port}", GROUP) for _ in range(2)]
        tasks = [asyncio.create_task(consume(c)) for c in consumers]
        target = rng.randrange(1, 900)  # the kill comes after this many acks, mid-stream
        deadline = time.monotonic() + 20
        while len(acked) < target and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        kill9(proc)
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert target <= len(acked) < len(bodies), "the kill came after the last ack"
        proc = start_gateway(data_dir, remoting_port=port)
        client = await PopClient.open(f"127.0.0.1:{port}", GROUP)
        after: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(acked | unsure | set(after)) < len(bodies) and time.monotonic() < deadline:
            for p in await client.pop(TOPIC, invisible_ms=60_000, poll_ms=300):
                after.append(p.body)
                assert (await client.ack(TOPIC, p)).code == ResponseCode.SUCCESS
        assert not acked & set(after), "an acknowledged message came back after the restart"
        assert acked | unsure | set(after) == bodies, "a popped message was lost"
        assert len(after) == len(set(after))
        client.close()
    finally:
        stop(proc)


async def test_pops_and_acks_are_traced(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, trace="remoting", metrics_bind="127.0.0.1:0") as (gw, addr):
        client = await PopClient.open(addr, GROUP)
        header = send_header(TOPIC, 0, properties="KEYS\x01job-7")
        assert (await client.raw.call(RequestCode.SEND_MESSAGE, header, b"traced")).code == ResponseCode.SUCCESS
        (p,) = await client.pop(TOPIC)
        assert (await client.ack(TOPIC, p)).code == ResponseCode.SUCCESS
        events = await trace_until(gw, "/admin/trace?key=job-7", {"publish", "store", "deliver", "ack"})
        kinds = {e["type"]: e for e in events}
        assert {"deliver", "ack"} <= kinds.keys(), events
        assert kinds["deliver"]["client"].startswith(f"{GROUP}@") and kinds["ack"]["queue"] == "r:Jobs:0"
        client.close()
