"""The remoting listener at the frame level, over raw sockets: JSON and ROCKETMQ binary
headers answered in kind, one-way requests never answered, unknown codes refused with
REQUEST_CODE_NOT_SUPPORTED, a malformed or oversized frame closes only its connection, a bad
header field gets an error response, and long polling answers when data arrives."""

from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path

from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.frames import FLAG_ONEWAY, SERIALIZE_ROCKETMQ
from protocols.remoting.message_codec import decode_messages
from tests.remoting_support import RawRemoting, pull_header, remoting_gateway, send_header


async def test_json_and_binary_headers_are_answered_in_kind(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        client = await RawRemoting.open(addr)
        reply = await client.call(RequestCode.SEND_MESSAGE, send_header("Raw"), b"json body")
        assert reply.code == ResponseCode.SUCCESS and reply.serialize_type == 0
        assert reply.ext_fields["queueOffset"] == "0"
        reply = await client.call(RequestCode.SEND_MESSAGE, send_header("Raw"), b"binary body",
                                  serialize_type=SERIALIZE_ROCKETMQ)
        assert reply.code == ResponseCode.SUCCESS and reply.serialize_type == SERIALIZE_ROCKETMQ
        pulled = await client.call(RequestCode.PULL_MESSAGE, pull_header("Raw", 0))
        assert pulled.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_messages(pulled.body)] == [b"json body", b"binary body"]
        assert pulled.ext_fields["nextBeginOffset"] == "2"
        client.close()


async def test_oneway_unknown_and_bad_requests(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, max_message_size=4096) as (gw, addr):
        client = await RawRemoting.open(addr)
        client.send(RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "Raw", "queueId": "0",
                                                         "commitOffset": "5"}, flag=FLAG_ONEWAY)
        unknown = await client.call(9999)  # the one-way request above got no answer: this is next
        assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert gw.store.get_offset_now("rmq:g", "r:Raw:0") == 5
        bad = await client.call(RequestCode.PULL_MESSAGE, {"consumerGroup": "g", "topic": "Raw",
                                                           "queueId": "zero", "queueOffset": "0"})
        assert bad.code == ResponseCode.SYSTEM_ERROR and "queueId" in (bad.remark or "")
        missing = await client.call(RequestCode.PULL_MESSAGE, pull_header("NoSuchTopic", 0))
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST
        too_big = await client.call(RequestCode.SEND_MESSAGE, send_header("Raw"), b"x" * 5000)
        assert too_big.code == ResponseCode.MESSAGE_ILLEGAL and "exceeds" in (too_big.remark or "")
        bad_topic = await client.call(RequestCode.SEND_MESSAGE, send_header("no spaces allowed"), b"x")
        assert bad_topic.code == ResponseCode.MESSAGE_ILLEGAL
        client.close()


async def test_malformed_and_oversized_frames_close_only_their_connection(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, remoting_max_frame_size=4096) as (_, addr):
        good = await RawRemoting.open(addr)
        bad_json = await RawRemoting.open(addr)
        header = b"{not json"
        bad_json.writer.write(struct.pack(">II", 4 + len(header), len(header)) + header)
        assert await bad_json.closed()
        too_big = await RawRemoting.open(addr)
        too_big.writer.write(struct.pack(">I", 1 << 20) + b"\x00" * 64)
        assert await too_big.closed()
        short = await RawRemoting.open(addr)
        short.writer.write(struct.pack(">II", 8, 1000) + b"abcd")  # header longer than its frame
        assert await short.closed()
        reply = await good.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "StillFine"})
        assert reply.code == ResponseCode.SUCCESS
        good.close()


async def test_long_poll_answers_when_a_message_arrives(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        consumer = await RawRemoting.open(addr)
        producer = await RawRemoting.open(addr)
        await producer.call(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "Poll", "readQueueNums": "1",
                                                                  "writeQueueNums": "1"})
        started = time.monotonic()
        opaque = consumer.send(RequestCode.PULL_MESSAGE, pull_header("Poll", 0, suspend_ms=10_000))
        await asyncio.sleep(0.5)
        await producer.call(RequestCode.SEND_MESSAGE, send_header("Poll"), b"wake up")
        reply = await consumer.recv()
        waited = time.monotonic() - started
        assert reply.opaque == opaque and reply.code == ResponseCode.SUCCESS
        assert [m.body for m in decode_messages(reply.body)] == [b"wake up"]
        assert 0.4 < waited < 3.0  # held, then answered by the notify, not by the timeout
        empty = await consumer.call(RequestCode.PULL_MESSAGE, pull_header("Poll", 1, suspend_ms=300))
        assert empty.code == ResponseCode.PULL_NOT_FOUND and empty.ext_fields["nextBeginOffset"] == "1"
        consumer.close()
        producer.close()
