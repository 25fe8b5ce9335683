"""Transactional messages over the remoting protocol. No installable client speaks them (ali-ons
sends half messages but has no END_TRANSACTION; PyPI's rocketmq 0.4.4 has no transactional
producer), so these tests follow the wire exchange of apache/rocketmq's Java client frame by
frame: DefaultMQProducerImpl.sendMessageInTransaction (the half message: TRAN_MSG=true, PGROUP,
sysFlag PREPARED), endTransaction (END_TRANSACTION, one-way, commitLogOffset decoded from
SEND_OK's offsetMsgId), the producer's heartbeat (producerDataSet) and
ClientRemotingProcessor.checkTransactionState (CHECK_TRANSACTION_STATE answered with a one-way
END_TRANSACTION, fromTransactionCheck=true)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.frames import FLAG_ONEWAY
from protocols.remoting.message_codec import decode_messages, decode_offset_msg_id
from protocols.remoting.properties import encode_properties
from store.holds.codec import HALF

from .crash_support import free_port, kill9, start_gateway, stop
from .remoting_support import RawRemoting, pull_header, remoting_gateway, send_header

GROUP = "tx-producers"
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0


async def send_half(client: RawRemoting, topic: str, body: bytes, group: str = GROUP) -> tuple[int, dict]:
    """The half message as DefaultMQProducerImpl.sendMessageInTransaction sends it; its
    commitlog offset as endTransaction decodes it from SEND_OK's msgId (offsetMsgId)."""
    props = encode_properties({"TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": f"uniq-{body.decode()}"})
    response = await client.call(RequestCode.SEND_MESSAGE, send_header(topic, producerGroup=group, sysFlag="4",
                                                                       properties=props), body)
    assert response.code == ResponseCode.SUCCESS, response.remark
    _, _, offset = decode_offset_msg_id(response.ext_fields["msgId"])
    return offset, response.ext_fields


def end_header(offset: int, kind: int, *, group: str = GROUP, from_check: bool = False) -> dict[str, str]:
    return {"producerGroup": group, "tranStateTableOffset": "0", "commitLogOffset": str(offset),
            "commitOrRollback": str(kind), "fromTransactionCheck": "true" if from_check else "false",
            "msgId": "m", "transactionId": "t"}


async def pulled(client: RawRemoting, topic: str) -> list:
    messages = []
    for queue_id in range(4):
        header = dict(pull_header(topic, 0), queueId=str(queue_id))
        response = await client.call(RequestCode.PULL_MESSAGE, header)
        if response.code == ResponseCode.SUCCESS:
            messages += decode_messages(response.body)
    return messages


async def wait_pulled(client: RawRemoting, topic: str, count: int, timeout_s: float = 10.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = await pulled(client, topic)
        if len(got) >= count:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"{topic}: fewer than {count} messages")


async def test_a_half_message_is_delivered_only_once_committed(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        producer = await RawRemoting.open(addr)
        committed, _ = await send_half(producer, "Orders", b"a")
        rolled_back, _ = await send_half(producer, "Orders", b"b")
        assert await pulled(producer, "Orders") == [] and gw.store.held.count(HALF) == 2
        producer.send(RequestCode.END_TRANSACTION, end_header(committed, COMMIT), flag=FLAG_ONEWAY)
        producer.send(RequestCode.END_TRANSACTION, end_header(rolled_back, ROLLBACK), flag=FLAG_ONEWAY)
        (message,) = await wait_pulled(producer, "Orders", 1)
        assert message.body == b"a" and message.sys_flag & 0xC == COMMIT
        assert "TRAN_MSG" not in message.properties and message.properties["PGROUP"] == GROUP
        await asyncio.sleep(0.3)
        assert [m.body for m in await pulled(producer, "Orders")] == [b"a"] and gw.store.held.count(HALF) == 0
        producer.close()


async def test_end_transaction_refusals_name_the_reason(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        producer = await RawRemoting.open(addr)
        offset, _ = await send_half(producer, "Orders", b"a")
        wrong_group = await producer.call(RequestCode.END_TRANSACTION, end_header(offset, COMMIT, group="other"))
        assert (wrong_group.code, wrong_group.remark) == (ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        unknown = await producer.call(RequestCode.END_TRANSACTION, end_header(offset + 1, COMMIT))
        assert (unknown.code, unknown.remark) == (ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
        not_yet = await producer.call(RequestCode.END_TRANSACTION, end_header(offset, UNKNOWN))
        assert not_yet.code == ResponseCode.SUCCESS and gw.store.held.count(HALF) == 1
        done = await producer.call(RequestCode.END_TRANSACTION, end_header(offset, COMMIT))
        assert done.code == ResponseCode.SUCCESS
        again = await producer.call(RequestCode.END_TRANSACTION, end_header(offset, ROLLBACK))
        assert again.code == ResponseCode.SYSTEM_ERROR  # ended already: committed, stays so
        assert [m.body for m in await pulled(producer, "Orders")] == [b"a"]
        producer.close()


async def test_an_open_transaction_is_checked_with_a_live_producer_of_its_group(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, remoting_transaction_timeout_s=0.2,
                                remoting_transaction_check_interval_s=0.3) as (gw, addr):
        producer = await RawRemoting.open(addr)
        beat = {"clientID": "10.0.0.1@tx", "producerDataSet": [{"groupName": GROUP}], "consumerDataSet": []}
        assert (await producer.call(RequestCode.HEART_BEAT, {}, json.dumps(beat).encode())).code == 0
        offset, _ = await send_half(producer, "Orders", b"checked")
        check = await producer.recv(timeout=5)  # the broker's request, one-way
        assert check.code == RequestCode.CHECK_TRANSACTION_STATE and check.flag & FLAG_ONEWAY
        assert int(check.ext_fields["commitLogOffset"]) == offset
        (half,) = decode_messages(check.body)
        assert half.body == b"checked" and half.sys_flag & 0xC == 4
        producer.send(RequestCode.END_TRANSACTION, end_header(offset, COMMIT, from_check=True), flag=FLAG_ONEWAY)
        (message,) = await wait_pulled(producer, "Orders", 1)
        assert message.body == b"checked"
        producer.close()


async def test_an_unanswered_transaction_is_rolled_back_after_its_checks(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, remoting_transaction_timeout_s=0.1, remoting_transaction_check_interval_s=0.2,
                                remoting_transaction_check_max=2) as (gw, addr):
        producer = await RawRemoting.open(addr)
        beat = {"clientID": "10.0.0.1@tx", "producerDataSet": [{"groupName": GROUP}], "consumerDataSet": []}
        assert (await producer.call(RequestCode.HEART_BEAT, {}, json.dumps(beat).encode())).code == 0
        await send_half(producer, "Orders", b"forgotten")
        checks = 0
        deadline = time.monotonic() + 10
        while gw.store.held.count(HALF) and time.monotonic() < deadline:
            try:
                request = await producer.recv(timeout=0.2)
            except TimeoutError:
                continue
            checks += request.code == RequestCode.CHECK_TRANSACTION_STATE
            producer.send(RequestCode.END_TRANSACTION, end_header(int(request.ext_fields["commitLogOffset"]), UNKNOWN,
                                                                  from_check=True), flag=FLAG_ONEWAY)
        assert gw.store.held.count(HALF) == 0 and checks == 2
        assert gw.remoting.transactions.rolled_back_unchecked == 1
        assert await pulled(producer, "Orders") == []
        producer.close()


async def test_an_open_transaction_survives_kill_9_and_commits_after_the_restart(data_dir: Path) -> None:
    port = free_port()
    proc = start_gateway(data_dir, remoting_port=port)
    try:
        producer = await RawRemoting.open(f"127.0.0.1:{port}")
        offset, _ = await send_half(producer, "Orders", b"durable")  # SEND_OK: stored, sync flush
        kill9(proc)
        proc = start_gateway(data_dir, remoting_port=port)
        producer = await RawRemoting.open(f"127.0.0.1:{port}")
        assert await pulled(producer, "Orders") == []
        producer.send(RequestCode.END_TRANSACTION, end_header(offset, COMMIT), flag=FLAG_ONEWAY)
        (message,) = await wait_pulled(producer, "Orders", 1)
        assert message.body == b"durable"
        producer.close()
    finally:
        stop(proc)
