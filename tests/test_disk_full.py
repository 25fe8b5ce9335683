"""A full disk under a running gateway, for real: the data dir on a small tmpfs, filled to
ENOSPC before the free-space alarm can fire (``disk_free_limit`` 0). Every write that fails is
answered with its protocol's error, reads go on, nothing is left unhandled on the event loop,
readiness says the store refuses writes, and once space is back the gateway takes writes again
by itself: the commitlog at once, the meta database (sessions, retained messages,
declarations) when RocksDB has recovered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import pytest
from aio_pika.exceptions import ChannelClosed, DeliveryError

from gateway.config import Config
from gateway.server import Gateway
from protocols.mqtt.packets import MQTT_5
from protocols.remoting.codes import RequestCode, ResponseCode
from tests.mqtt_support import PahoClient
from tests.remoting_support import TEST_DELAY_LEVELS, RawRemoting, ons, send_header

# Larger than the unused rest of a page of the meta database's log: a write of it needs a page
# the full disk does not have (a small write may still fit where the last one ended).
LARGE = 6000


@pytest.fixture
def tmpfs(tmp_path: Path) -> AsyncIterator[Path]:
    """An 8 MiB tmpfs: ENOSPC for real, without filling the machine's disk."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs the suite as root)")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tidemq-test", str(mountpoint)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"could not mount a tmpfs: {result.stderr.strip()}")
    yield mountpoint
    subprocess.run(["umount", "-l", str(mountpoint)], check=False)


@pytest.fixture
async def loop_errors(caplog: pytest.LogCaptureFixture) -> AsyncIterator[list[dict[str, Any]]]:
    """What reached the event loop's exception handler (an exception no one handled)."""
    caught: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: caught.append(context))
    yield caught
    loop.set_exception_handler(None)
    logged = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert not logged, logged


class FullDisk:
    """A gateway (MQTT, AMQP, remoting) whose data dir is on ``mountpoint``."""

    def __init__(self, mountpoint: Path) -> None:
        self.mountpoint = mountpoint
        self.filler = mountpoint / "filler"
        self.gateway: Gateway | None = None

    async def start(self, **config: Any) -> Gateway:
        # (the offset checkpoint also tells when meta takes writes again: often, to wait less)
        self.gateway = Gateway(Config(
            data_dir=self.mountpoint / "data", mqtt_bind="127.0.0.1:0", amqp_bind="127.0.0.1:0",
            remoting_bind="127.0.0.1:0", remoting_delay_levels=TEST_DELAY_LEVELS, disk_free_limit=0,
            segment_size=1 << 20, checkpoint_interval_s=0.2, **config))
        await self.gateway.start()
        return self.gateway

    async def recovered(self) -> None:
        """Space is back: wait until readiness no longer says the store refuses writes."""
        assert self.gateway is not None
        deadline = asyncio.get_running_loop().time() + 30
        while (problem := self.gateway.not_ready()) is not None:
            assert asyncio.get_running_loop().time() < deadline, problem
            await asyncio.sleep(0.1)

    def port(self, protocol: str) -> int:
        assert self.gateway is not None
        return next(listener.address[1] for listener in self.gateway.listeners if listener.protocol == protocol)

    @property
    def amqp_url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port('amqp')}/"

    @property
    def remoting_addr(self) -> str:
        return f"127.0.0.1:{self.port('remoting')}"

    def fill(self) -> None:
        with self.filler.open("ab", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == 28, exc  # ENOSPC
        assert os.statvfs(self.mountpoint).f_bavail == 0

    def free(self) -> None:
        self.filler.unlink()


@pytest.fixture
async def disk(tmpfs: Path) -> AsyncIterator[FullDisk]:
    full = FullDisk(tmpfs)
    await full.start()
    try:
        yield full
    finally:
        if full.gateway is not None:
            with contextlib.suppress(Exception):
                full.free()
            await full.gateway.stop()


async def publish_acked(client: PahoClient, topic: str, payload: bytes, *, retain: bool = False) -> int | None:
    """A QoS 1 publish: its PUBACK's reason code, or None when the connection closed without one."""
    loop = asyncio.get_running_loop()
    acked: asyncio.Future[int] = loop.create_future()
    client.client.on_publish = lambda c, u, mid, rc, props: loop.call_soon_threadsafe(
        lambda: acked.done() or acked.set_result(rc.value))
    closed: asyncio.Future[int] = loop.create_future()
    client.client.on_disconnect = lambda c, u, flags, rc, props: loop.call_soon_threadsafe(
        lambda: closed.done() or closed.set_result(rc.value))
    client.client.publish(topic, payload, 1, retain)
    done, _ = await asyncio.wait([acked, closed], timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert done, "neither a PUBACK nor a close"
    return acked.result() if acked in done else None


async def disconnected(client: PahoClient) -> int:
    rc = await asyncio.to_thread(client.disconnects.get, True, 5)
    return rc.value


async def test_mqtt_on_a_full_disk(disk: FullDisk, loop_errors: list) -> None:
    port = disk.port("mqtt")
    reader = PahoClient(port, "reader", clean=False)
    await reader.connect()
    await reader.subscribe("t/#", 1)
    await reader.disconnect()
    v5 = PahoClient(port, "pub5", version=MQTT_5)
    await v5.connect()
    for i in range(3):
        assert await publish_acked(v5, "t/a", f"m{i}".encode()) == 0
    disk.fill()

    # a publish that cannot be stored: 5.0 PUBACK 0x80; 3.1.1 has no negative PUBACK: closed
    assert await publish_acked(v5, "t/a", b"x" * LARGE) == 0x80
    v3 = PahoClient(port, "pub3")
    await v3.connect()
    assert await publish_acked(v3, "t/a", b"x" * LARGE) is None
    v3.client.loop_stop()
    # a subscription whose session cannot be stored: the first one meets the failed write
    # (DISCONNECT 0x80), the ones after are refused in their SUBACK
    sub5 = PahoClient(port, "sub5", version=MQTT_5, clean=False, session_expiry=600)
    await sub5.connect()
    sub5.client.subscribe("s/" + "f" * LARGE, 1)
    assert await disconnected(sub5) == 0x80
    sub5.client.loop_stop()
    sub5 = PahoClient(port, "sub5", version=MQTT_5, clean=False, session_expiry=600)
    await sub5.connect()
    assert [code.value for code in await sub5.subscribe("s/#", 1)] == [0x80]
    sub3 = PahoClient(port, "sub3", clean=False)
    await sub3.connect()
    assert [code.value for code in await sub3.subscribe("s/#", 1)] == [0x80]
    # a clean start over a stored session it cannot delete is refused (3.1.1: 0x03 server unavailable)
    clean = PahoClient(port, "reader", clean=True)
    _, rc, _ = await clean.connect()
    assert rc.is_failure and "unavailable" in str(rc).lower(), rc
    clean.client.loop_stop()
    # a persistent session still connects and reads what is stored
    reader = PahoClient(port, "reader", clean=False)
    flags, rc, _ = await reader.connect()
    assert rc.value == 0 and flags.session_present
    assert [m.payload for m in await reader.receive(3)] == [b"m0", b"m1", b"m2"]
    assert disk.gateway is not None and "refuses writes" in (disk.gateway.not_ready() or "")

    # space back: the gateway takes writes again by itself
    disk.free()
    await disk.recovered()
    assert await publish_acked(v5, "t/a", b"m3") == 0
    assert [m.payload for m in await reader.receive(1)] == [b"m3"]
    deadline = asyncio.get_running_loop().time() + 30  # (the sessions' write is tried again every second)
    while [code.value for code in await sub5.subscribe("s/#", 1)] != [1]:
        assert asyncio.get_running_loop().time() < deadline, "subscriptions still refused"
        await asyncio.sleep(0.2)
    for client in (v5, sub3, sub5, reader):
        await client.disconnect()
    assert not loop_errors, loop_errors


async def test_retained_publish_whose_retain_cannot_be_recorded(disk: FullDisk, loop_errors: list) -> None:
    """The message is stored (in what is left of the commitlog's last page) but its retained
    record is not (meta's log has failed): 5.0 PUBACK 0x80, 3.1.1 closed."""
    assert disk.gateway is not None
    await disk.gateway.stop()
    await disk.start(mqtt_presence_events=False, metrics_bind="127.0.0.1:0")  # (presence records would take the room kept below)
    port = disk.port("mqtt")
    v5 = PahoClient(port, "pub5", version=MQTT_5)
    await v5.connect()
    assert await publish_acked(v5, "r/a", b"old", retain=True) == 0
    assert disk.gateway is not None and disk.gateway.store is not None
    while -disk.gateway.store.commitlog.end_position % 4096 < 1024:  # room in the page for two small records
        assert await publish_acked(v5, "pad", b"p" * 500) == 0
    disk.fill()
    async with await aio_pika.connect(disk.amqp_url) as amqp:  # the meta database's log meets ENOSPC
        channel = await amqp.channel()
        with pytest.raises(ChannelClosed) as refused:
            await channel.declare_queue("big", durable=True, arguments={"x-note": "n" * LARGE})
        assert "541" in str(refused.value) or "INTERNAL_ERROR" in str(refused.value), refused.value
    assert await publish_acked(v5, "r/a", b"new", retain=True) == 0x80
    v3 = PahoClient(port, "pub3")
    await v3.connect()
    assert await publish_acked(v3, "r/b", b"new", retain=True) is None
    v3.client.loop_stop()
    async with aiohttp.ClientSession() as http, http.post(  # the data API: 503, retry
            "http://{}:{}/data/publish".format(*disk.gateway.metrics_address), params={"retain": "true"},
            data=b'{"topic": "r/c", "payload": "new"}\n', headers={"Content-Type": "application/x-ndjson"}) as answer:
        assert answer.status == 503, await answer.text()
    late = PahoClient(port, "late", version=MQTT_5)
    await late.connect()
    await late.subscribe("r/#", 1)
    assert [(m.topic, m.payload) for m in await late.receive(1)] == [("r/a", b"old")]
    await late.nothing_more()
    await late.disconnect()

    disk.free()
    await disk.recovered()
    assert await publish_acked(v5, "r/a", b"new", retain=True) == 0
    await v5.disconnect()
    late = PahoClient(port, "late", version=MQTT_5)
    await late.connect()
    await late.subscribe("r/#", 1)
    assert [(m.topic, m.payload) for m in await late.receive(1)] == [("r/a", b"new")]
    await late.disconnect()
    assert not loop_errors, loop_errors


async def test_amqp_on_a_full_disk(disk: FullDisk, loop_errors: list) -> None:
    async with await aio_pika.connect(disk.amqp_url) as amqp:
        channel = await amqp.channel(publisher_confirms=True)
        queue = await channel.declare_queue("q", durable=True)
        await channel.default_exchange.publish(aio_pika.Message(b"a1"), routing_key="q")
        disk.fill()
        with pytest.raises(DeliveryError):  # nacked
            await channel.default_exchange.publish(aio_pika.Message(b"x" * LARGE), routing_key="q")
        declaring = await amqp.channel()
        with pytest.raises(ChannelClosed) as refused:  # a durable declaration not written: 541, the channel only
            await declaring.declare_queue("q2", durable=True, arguments={"x-note": "n" * LARGE})
        assert "541" in str(refused.value) or "INTERNAL_ERROR" in str(refused.value), refused.value
        with pytest.raises(ChannelClosed):  # not declared
            await (await amqp.channel()).declare_queue("q2", passive=True)
        with pytest.raises(ChannelClosed) as refused:  # a deletion not written: not made either
            await (await amqp.channel()).queue_delete("q")
        assert "541" in str(refused.value) or "INTERNAL_ERROR" in str(refused.value), refused.value
        got = await queue.get(timeout=5)  # the other channel reads on
        assert got.body == b"a1"
        await got.ack()
        disk.free()
        await disk.recovered()
        await channel.default_exchange.publish(aio_pika.Message(b"a2"), routing_key="q")
        assert (await queue.get(timeout=5)).body == b"a2"
        await (await amqp.channel()).declare_queue("q2", durable=True, arguments={"x-note": "n" * LARGE})
    assert not loop_errors, loop_errors


async def test_remoting_send_on_a_full_disk(disk: FullDisk, loop_errors: list) -> None:
    addr = disk.remoting_addr
    sent = await ons({"cmd": "send", "nameSrv": addr, "topic": "Full", "messages": [{"body": "r1"}]})
    assert [e["sendStatus"] for e in sent if e["event"] == "sent"] == ["SEND_OK"]
    disk.fill()
    refused = await ons({"cmd": "send", "nameSrv": addr, "topic": "Full", "reportErrors": True,
                         "messages": [{"body": "x" * LARGE}]})
    assert [e["event"] for e in refused] == ["error"], refused  # (ali-ons retries, then gives up)
    raw = await RawRemoting.open(addr)  # what ali-ons was answered
    answer = await raw.call(RequestCode.SEND_MESSAGE, send_header("Full"), b"x" * LARGE)
    raw.close()
    assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE and "No space left" in answer.remark, answer
    got = await ons({"cmd": "consume", "nameSrv": addr, "group": "g", "topic": "Full", "count": 1,
                     "fromFirst": True, "timeoutMs": 20000})
    assert [e["body"] for e in got if e["event"] == "message"] == ["r1"]
    disk.free()
    sent = await ons({"cmd": "send", "nameSrv": addr, "topic": "Full", "messages": [{"body": "r2"}]})
    assert [e["sendStatus"] for e in sent if e["event"] == "sent"] == ["SEND_OK"]
    assert not loop_errors, loop_errors


async def test_amqp_message_given_back_on_a_full_disk_is_not_lost(disk: FullDisk, loop_errors: list) -> None:
    """A queue with a delivery limit counts each give-back in the meta database: when that
    write fails (the disk full, RocksDB refusing writes), the message still goes back to the
    queue and comes again."""
    async with await aio_pika.connect(disk.amqp_url) as amqp:
        channel = await amqp.channel()
        queue = await channel.declare_queue("limited", durable=True, arguments={"x-delivery-limit": 5})
        await channel.default_exchange.publish(aio_pika.Message(b"m1"), routing_key="limited")
        got = await queue.get(timeout=5)
        disk.fill()
        with pytest.raises(ChannelClosed):  # (a write of the meta database fails: it refuses writes now)
            await (await amqp.channel()).declare_queue("q2", durable=True, arguments={"x-note": "n" * LARGE})
        await got.nack(requeue=True)
        again = await queue.get(timeout=5)
        assert again.body == b"m1" and again.redelivered
        await again.ack()
        disk.free()
        await disk.recovered()
    assert not loop_errors, loop_errors
