"""More of AMQP 0-9-1 through aio-pika and raw frames: server-named and auto-delete queues,
unbind, exchange delete if-unused, global and size prefetch, channel.flow, heartbeats."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pytest
from aio_pika.exceptions import ChannelPreconditionFailed
from pamqp import commands, frame

from protocols.amqp.frames import method_frame
from tests.test_amqp import amqp_gateway, get, raw_handshake

TIMEOUT = 5.0


async def test_server_named_and_auto_delete_queues(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (gw, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        named = await ch.declare_queue("", exclusive=True)
        assert named.name.startswith("amq.gen-")
        temp = await ch.declare_queue("temp", auto_delete=True)
        tag = await temp.consume(_ignore)
        assert "temp" in gw.amqp.queues
        await temp.cancel(tag)
        for _ in range(50):
            if "temp" not in gw.amqp.queues:
                break
            await asyncio.sleep(0.05)
        assert "temp" not in gw.amqp.queues  # its last consumer left
        await conn.close()


async def _ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    pass


async def test_unbind_and_exchange_delete_if_unused(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        ex = await ch.declare_exchange("events", aio_pika.ExchangeType.DIRECT)
        q = await ch.declare_queue("events-q")
        await q.bind(ex, "a")
        await ex.publish(aio_pika.Message(b"bound"), "a")
        assert (await get(q)).body == b"bound"
        with pytest.raises(ChannelPreconditionFailed):
            await (await conn.channel()).exchange_delete("events", if_unused=True)
        await q.unbind(ex, "a")
        await ex.publish(aio_pika.Message(b"unbound"), "a")
        await asyncio.sleep(0.3)
        assert await q.get(fail=False) is None
        await (await conn.channel()).exchange_delete("events", if_unused=True)  # no bindings left
        await conn.close()


async def test_global_and_size_prefetch(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=3, global_=True)
        queues = [await ch.declare_queue(f"g{i}") for i in range(2)]
        for q in queues:
            for n in range(5):
                await ch.default_exchange.publish(aio_pika.Message(f"{q.name}-{n}".encode()), q.name)
        got: list[aio_pika.abc.AbstractIncomingMessage] = []

        async def keep(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.append(message)

        for q in queues:
            await q.consume(keep)
        await asyncio.sleep(0.5)
        assert len(got) == 3  # shared by both consumers of the channel
        await got[0].ack()
        await asyncio.sleep(0.3)
        assert len(got) == 4

        sized = await conn.channel()
        await sized.set_qos(prefetch_size=100)
        big = await sized.declare_queue("big")
        for n in range(3):
            await sized.default_exchange.publish(aio_pika.Message(bytes(60)), "big")
        held: list[aio_pika.abc.AbstractIncomingMessage] = []

        async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            held.append(message)

        await big.consume(hold)
        await asyncio.sleep(0.5)
        assert len(held) == 1  # a second 60-byte message would pass 100 unacked bytes
        await held[0].ack()
        await asyncio.sleep(0.3)
        assert len(held) == 2
        await conn.close()


async def _frames_until(reader: asyncio.StreamReader, kind: type, timeout: float = TIMEOUT) -> list:
    """Frames read until one of ``kind`` arrives (returned with those before it)."""
    data = b""
    frames: list = []
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise AssertionError(f"no {kind.__name__} in {frames}")
        chunk = await asyncio.wait_for(reader.read(65536), left)
        if not chunk:
            raise AssertionError(f"closed before {kind.__name__}: {frames}")
        data += chunk
        while data:
            try:
                used, _, value = frame.unmarshal(data)
            except Exception:
                break  # an incomplete frame: read more
            frames.append(value)
            data = data[used:]
            if isinstance(value, kind):
                return frames


async def test_channel_flow_stops_and_resumes_deliveries(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        port = int(url.rsplit(":", 1)[1].strip("/"))
        reader, writer = await raw_handshake(port)
        writer.write(method_frame(1, commands.Channel.Open()))
        await _frames_until(reader, commands.Channel.OpenOk)
        writer.write(method_frame(1, commands.Queue.Declare(queue="flow-q")))
        await _frames_until(reader, commands.Queue.DeclareOk)
        writer.write(method_frame(1, commands.Basic.Consume(queue="flow-q", consumer_tag="c", no_ack=True)))
        await _frames_until(reader, commands.Basic.ConsumeOk)
        writer.write(method_frame(1, commands.Channel.Flow(active=False)))
        ok = (await _frames_until(reader, commands.Channel.FlowOk))[-1]
        assert ok.active is False
        publisher = await aio_pika.connect(url)
        pch = await publisher.channel()
        await pch.default_exchange.publish(aio_pika.Message(b"held back"), "flow-q")
        with pytest.raises(TimeoutError):  # nothing is delivered while the flow is off
            await _frames_until(reader, commands.Basic.Deliver, timeout=0.8)
        writer.write(method_frame(1, commands.Channel.Flow(active=True)))
        frames = await _frames_until(reader, commands.Basic.Deliver)
        assert any(isinstance(f, commands.Channel.FlowOk) and f.active for f in frames)
        writer.close()
        await publisher.close()


async def test_heartbeats_both_ways(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (gw, url):
        gw.amqp.heartbeat = 1  # what connection.tune proposes
        port = int(url.rsplit(":", 1)[1].strip("/"))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        from protocols.amqp.frames import PROTOCOL_HEADER

        writer.write(PROTOCOL_HEADER)
        await _frames_until(reader, commands.Connection.Start)
        writer.write(method_frame(0, commands.Connection.StartOk(response="\x00guest\x00guest")))
        tune = (await _frames_until(reader, commands.Connection.Tune))[-1]
        assert tune.heartbeat == 1
        writer.write(method_frame(0, commands.Connection.TuneOk(2047, 131072, 1)))
        writer.write(method_frame(0, commands.Connection.Open("/")))
        await _frames_until(reader, commands.Connection.OpenOk)
        # the server beats while we are quiet, then gives up on us (no frame for 2 x heartbeat)
        from pamqp.heartbeat import Heartbeat

        await _frames_until(reader, Heartbeat, timeout=3.0)
        closed = False
        deadline = asyncio.get_running_loop().time() + 6.0
        while asyncio.get_running_loop().time() < deadline:
            if not await asyncio.wait_for(reader.read(65536), 6.0):
                closed = True
                break
        assert closed


async def test_message_id_is_the_key_of_an_amqp_message(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (gw, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        await ch.declare_queue("keyed")
        await ch.default_exchange.publish(aio_pika.Message(b"invoice", message_id="inv-42"), "keyed")
        await get(await ch.get_queue("keyed"))
        found = gw.store.query_by_key("keyed", "inv-42")  # stored under its routing key
        assert [m.body for m in found] == [b"invoice"]
        await conn.close()


async def test_exchange_to_exchange_bindings_route_once_and_survive_a_restart(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        src = await ch.declare_exchange("src", aio_pika.ExchangeType.TOPIC, durable=True)
        dst = await ch.declare_exchange("dst", aio_pika.ExchangeType.FANOUT, durable=True)
        q = await ch.declare_queue("e2e", durable=True)
        await q.bind(dst)
        await dst.bind(src, "a.*")
        await src.bind(dst, "#")  # a loop: routing still reaches each exchange once
        await src.publish(aio_pika.Message(b"through"), "a.b")
        await src.publish(aio_pika.Message(b"not this"), "x.y")
        through = await get(q)
        assert through.body == b"through"
        await through.ack()
        await asyncio.sleep(0.3)
        assert await q.get(fail=False) is None  # once, and "x.y" did not pass the binding
        await conn.close()
    async with amqp_gateway(data_dir) as (_, url):  # durable bindings come back
        conn = await aio_pika.connect(url)
        ch = await conn.channel()
        src = await ch.get_exchange("src")
        dst = await ch.get_exchange("dst")
        q = await ch.get_queue("e2e")
        await src.publish(aio_pika.Message(b"after restart"), "a.c")
        after = await get(q)
        assert after.body == b"after restart"
        await after.ack()
        await dst.unbind(src, "a.*")
        await src.publish(aio_pika.Message(b"unbound"), "a.d")
        await asyncio.sleep(0.3)
        assert await q.get(fail=False) is None
        await conn.close()


async def test_transactions_hold_publishes_and_acks_until_commit(data_dir: Path) -> None:
    import pika

    async with amqp_gateway(data_dir) as (gw, url):
        port = int(url.rsplit(":", 1)[1].strip("/"))
        conn = await asyncio.to_thread(pika.BlockingConnection, pika.ConnectionParameters(
            "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest")))
        try:
            ch = await asyncio.to_thread(conn.channel)
            await asyncio.to_thread(ch.queue_declare, "tx-q")
            await asyncio.to_thread(ch.tx_select)
            await asyncio.to_thread(ch.basic_publish, "", "tx-q", b"rolled back")
            await asyncio.to_thread(ch.tx_rollback)
            await asyncio.to_thread(ch.basic_publish, "", "tx-q", b"committed")
            await asyncio.sleep(0.3)
            assert gw.amqp.queues["tx-q"].ready_count() == 0  # nothing stored before the commit
            await asyncio.to_thread(ch.tx_commit)
            assert gw.amqp.queues["tx-q"].ready_count() == 1  # CommitOk came after the store
            method, _, body = await asyncio.to_thread(ch.basic_get, "tx-q")
            assert body == b"committed"
            await asyncio.to_thread(ch.basic_ack, method.delivery_tag)
            await asyncio.to_thread(ch.tx_rollback)  # the ack is undone: still unacknowledged
            assert len(gw.amqp.queues["tx-q"].group.cursor.unacked) == 1
            await asyncio.to_thread(ch.basic_ack, method.delivery_tag)
            await asyncio.to_thread(ch.tx_commit)
            assert len(gw.amqp.queues["tx-q"].group.cursor.unacked) == 0
            confirm_ch = await asyncio.to_thread(conn.channel)
            await asyncio.to_thread(confirm_ch.confirm_delivery)
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
                await asyncio.to_thread(confirm_ch.tx_select)  # 406: a confirm channel cannot be transactional
            assert err.value.reply_code == 406
        finally:
            await asyncio.to_thread(conn.close)
