"""What each remoting request code needs of the principal's rights on MQTT topic space
(gateway/remoting/access.py's REQUEST_NEEDS): consumer offsets, topic creation and route
lookups through ali-ons' own requests; queue locks, heartbeats' subscriptions, pops and acks,
the topic list and transactions' ends and checks in frames, as no installable client sends them."""

from __future__ import annotations

import json
import time
from pathlib import Path

from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.message_codec import decode_messages, decode_offset_msg_id
from protocols.remoting.properties import encode_properties
from store.holds.codec import HALF
from tests.remoting_support import RawRemoting, ons, pull_header, remoting_gateway, send_header
from tests.test_remoting_access import KEYS, secured, signed

__all__ = ["secured"]  # (the fixture: a password file, the ACL, access keys)


async def ons_api(addr: str, user: str, calls: list[list]) -> list[dict]:
    """ali-ons' own request methods called as ``user``: one result or error event each."""
    ak, sk = KEYS[user]
    events = await ons({"cmd": "api", "nameSrv": addr, "accessKey": ak, "secretKey": sk, "calls": calls})
    return [e for e in events if e["event"] in ("result", "error")]


async def send_secret(raw: RawRemoting, bodies: list[bytes], queue_id: int = 0) -> None:
    for body in bodies:  # (as alice: mallory may not write the MQTT topic "secret")
        ext = signed(send_header("secret", queue_id), body, "alice")
        assert (await raw.call(RequestCode.SEND_MESSAGE, ext, body)).code == 0


async def test_offsets_and_topics_mallory_may_not_read_refused_with_ali_ons(data_dir: Path, secured: dict) -> None:
    async with remoting_gateway(data_dir, **secured) as (gw, addr):
        config = {"topicName": "secret", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6,
                  "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}
        events = await ons_api(addr, "mallory", [["createTopic", "$broker", "TBW102", config, 3000],
                                                 ["getTopicRouteInfoFromNameServer", "secret", 3000]])
        assert [e.get("code") for e in events] == [ResponseCode.NO_PERMISSION] * 2
        assert gw.remoting.topics.get("secret") is None  # not created by either
        raw = await RawRemoting.open(addr)
        await send_secret(raw, [b"s1", b"s2", b"s3"])
        raw.close()
        group = {"consumerGroup": "GID-alice", "topic": "secret", "queueId": 0}
        events = await ons_api(addr, "alice", [["updateConsumerOffsetOneway", "$broker", {**group, "commitOffset": 1}],
                                               ["queryConsumerOffset", "$broker", group, 3000]])
        assert [e.get("value") for e in events] == [None, 1]
        # mallory would skip alice's group past messages she may not read, or watch it
        events = await ons_api(addr, "mallory", [
            ["updateConsumerOffsetOneway", "$broker", {**group, "commitOffset": 3}],
            ["queryConsumerOffset", "$broker", group, 3000],
            ["getMaxOffset", "$broker", "secret", 0, 3000],
            ["searchOffset", "$broker", "secret", 0, str(int(time.time() * 1000)), 3000]])
        assert [(e["event"], e.get("code")) for e in events[1:]] == [("error", ResponseCode.NO_PERMISSION)] * 3, events
        assert gw.store.get_offset_now("rmq:GID-alice", "r:secret:0") == 1
        events = await ons_api(addr, "alice", [["queryConsumerOffset", "$broker", group, 3000],
                                               ["getMaxOffset", "$broker", "secret", 0, 3000]])
        assert [e.get("value") for e in events] == [1, 3]


async def test_every_request_on_a_topic_needs_rights_on_it(data_dir: Path, secured: dict) -> None:
    async with remoting_gateway(data_dir, **secured) as (gw, addr):
        raw = await RawRemoting.open(addr)
        await send_secret(raw, [b"s1", b"s2"])
        ext = signed(send_header("public"), b"p", "mallory")
        assert (await raw.call(RequestCode.SEND_MESSAGE, ext, b"p")).code == 0

        async def as_mallory(code: int, fields: dict[str, str], body: bytes = b"") -> int:
            return (await raw.call(code, signed(fields, body, "mallory"), body)).code

        queue = {"topic": "secret", "queueId": "0"}
        for code in (RequestCode.GET_MIN_OFFSET, RequestCode.GET_EARLIEST_MSG_STORETIME, RequestCode.GET_MAX_OFFSET,
                     RequestCode.QUERY_CONSUMER_OFFSET):
            assert await as_mallory(code, {**queue, "consumerGroup": "GID-alice"}) == ResponseCode.NO_PERMISSION, code
        committing = dict(pull_header("secret", 2), sysFlag="1", commitOffset="2", consumerGroup="GID-alice")
        assert await as_mallory(RequestCode.PULL_MESSAGE, committing) == ResponseCode.NO_PERMISSION
        assert gw.store.get_offset_now("rmq:GID-alice", "r:secret:0") is None
        # queue locks of an orderly consumer group, the group's membership
        mq_set = json.dumps({"consumerGroup": "GID-alice", "clientId": "mallory@1",
                             "mqSet": [{"topic": "secret", "brokerName": "tidemq", "queueId": 0}]}).encode()
        assert await as_mallory(RequestCode.LOCK_BATCH_MQ, {}, mq_set) == ResponseCode.NO_PERMISSION
        assert await as_mallory(RequestCode.UNLOCK_BATCH_MQ, {}, mq_set) == ResponseCode.NO_PERMISSION
        assert not gw.remoting._locks
        beat = json.dumps({"clientID": "mallory@1", "producerDataSet": [], "consumerDataSet": [
            {"groupName": "GID-alice", "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
             "subscriptionDataSet": [{"topic": "secret", "subString": "*", "expressionType": "TAG"}]}]}).encode()
        assert await as_mallory(RequestCode.HEART_BEAT, {}, beat) == ResponseCode.NO_PERMISSION
        assert gw.remoting.groups.client_ids("GID-alice") == []
        # pops and their acks
        pop = {"consumerGroup": "GID-alice", "topic": "secret", "queueId": "0", "maxMsgNums": "1",
               "invisibleTime": "60000", "pollTime": "0", "bornTime": "0", "initMode": "0"}
        assert await as_mallory(RequestCode.POP_MESSAGE, pop) == ResponseCode.NO_PERMISSION
        ack = {"consumerGroup": "GID-alice", "topic": "secret", "queueId": "0", "extraInfo": "0 0 60000 1 tidemq 0 0",
               "offset": "0"}
        assert await as_mallory(RequestCode.ACK_MESSAGE, ack) == ResponseCode.NO_PERMISSION
        assert await as_mallory(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, {**ack, "invisibleTime": "1000"}) == \
            ResponseCode.NO_PERMISSION
        batch = json.dumps({"acks": [{"c": "GID-alice", "t": "secret", "q": 0, "so": 0, "pt": 0, "it": 60000,
                                      "b": "", "r": "1"}]}).encode()
        assert await as_mallory(RequestCode.BATCH_ACK_MESSAGE, {}, batch) == ResponseCode.NO_PERMISSION
        # some right under "devices", not on devices/d1/cmd: its messages are skipped, not found
        props = encode_properties({"KEYS": "k-cmd", "mqttSecondTopic": "/d1/cmd"})
        ext = signed(send_header("devices", properties=props), b"reboot", "alice")
        assert (await raw.call(RequestCode.SEND_MESSAGE, ext, b"reboot")).code == 0
        query = {"topic": "devices", "key": "k-cmd", "maxNum": "32", "beginTimestamp": "0",
                 "endTimestamp": str(1 << 60)}
        assert await as_mallory(RequestCode.QUERY_MESSAGE, query) == ResponseCode.QUERY_NOT_FOUND
        skipped = await raw.call(RequestCode.PULL_MESSAGE, signed(pull_header("devices", 0), b"", "mallory"))
        assert skipped.code == ResponseCode.PULL_RETRY_IMMEDIATELY and not skipped.body
        # the topic list: only the topics mallory has some right under
        listed = await raw.call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, signed({}, b"", "mallory"))
        assert "public" in json.loads(listed.body)["topicList"] and "secret" not in json.loads(listed.body)["topicList"]
        listed = await raw.call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, signed({}, b"", "alice"))
        assert {"public", "secret"} <= set(json.loads(listed.body)["topicList"])
        # alice may do all of it
        assert (await raw.call(RequestCode.GET_MIN_OFFSET, signed(queue, b"", "alice"))).code == 0
        alice_beat = beat.replace(b"mallory@1", b"alice@1")
        assert (await raw.call(RequestCode.HEART_BEAT, signed({}, alice_beat, "alice"), alice_beat)).code == 0
        raw.close()


async def test_a_transaction_is_ended_and_checked_only_by_who_may_write_its_topic(data_dir: Path,
                                                                                    secured: dict) -> None:
    async with remoting_gateway(data_dir, remoting_transaction_timeout_s=0.2, **secured) as (gw, addr):
        mallory, alice = await RawRemoting.open(addr), await RawRemoting.open(addr)
        for raw, user in ((mallory, "mallory"), (alice, "alice")):  # (mallory's the first producer of the group)
            beat = json.dumps({"clientID": f"{user}@tx", "producerDataSet": [{"groupName": "tx"}],
                               "consumerDataSet": []}).encode()
            assert (await raw.call(RequestCode.HEART_BEAT, signed({}, beat, user), beat)).code == 0
        props = encode_properties({"TRAN_MSG": "true", "PGROUP": "tx", "UNIQ_KEY": "u-1"})
        half = signed(send_header("secret", producerGroup="tx", sysFlag="4", properties=props), b"half", "alice")
        sent = await alice.call(RequestCode.SEND_MESSAGE, half, b"half")
        assert sent.code == 0
        _, _, position = decode_offset_msg_id(sent.ext_fields["msgId"])
        end = {"producerGroup": "tx", "tranStateTableOffset": "0", "commitLogOffset": str(position),
               "commitOrRollback": "12", "fromTransactionCheck": "false", "msgId": "m", "transactionId": "t"}
        refused = await mallory.call(RequestCode.END_TRANSACTION, signed(end, b"", "mallory"))
        assert refused.code == ResponseCode.NO_PERMISSION and gw.store.held.count(HALF) == 1
        # the check (with the half message's body) goes to alice, who may write "secret"
        check = await alice.recv()
        assert check.code == RequestCode.CHECK_TRANSACTION_STATE and b"half" in check.body
        assert (await mallory.call(RequestCode.GET_MIN_OFFSET, signed({"topic": "public", "queueId": "0"}, b"",
                                                                       "mallory"))).code == 0
        assert mallory.server_requests == []
        commit = dict(end, commitOrRollback="8")
        assert (await alice.call(RequestCode.END_TRANSACTION, signed(commit, b"", "alice"))).code == 0
        assert gw.store.held.count(HALF) == 0
        mallory.close()
        alice.close()


async def test_every_request_code_the_broker_handles_has_an_access_rule(data_dir: Path) -> None:
    from gateway.remoting.access import REQUEST_NEEDS

    async with remoting_gateway(data_dir) as (gw, _):
        assert set(gw.remoting.handlers) == set(REQUEST_NEEDS)


async def test_a_refused_send_creates_no_topic_and_internal_properties_are_refused(data_dir: Path,
                                                                                      secured: dict) -> None:
    async with remoting_gateway(data_dir, **secured) as (gw, addr):
        raw = await RawRemoting.open(addr)
        ext = signed(send_header("secret"), b"leak", "mallory")
        assert (await raw.call(RequestCode.SEND_MESSAGE, ext, b"leak")).code == ResponseCode.NO_PERMISSION
        assert gw.remoting.topics.get("secret") is None
        # rmq.ot is the gateway's (the topic a retried message was first on): were a sender's
        # taken, a cmd message would pass mallory's deny rule as a retry topic's
        ak, sk = KEYS["alice"]
        events = await ons({"cmd": "send", "nameSrv": addr, "topic": "devices", "accessKey": ak, "secretKey": sk,
                            "reportErrors": True, "messages": [
                                {"body": "reboot", "properties": {"mqttSecondTopic": "/d1/cmd", "rmq.ot": "%RETRY%x"}},
                                {"body": "fine", "properties": {"mqttSecondTopic": "/d1/status"}}]})
        assert [(e["event"], e.get("code")) for e in events] == [("error", ResponseCode.MESSAGE_ILLEGAL),
                                                                 ("sent", None)]
        assert "rmq.ot is used by the system" in events[0]["message"]
        got = []
        for queue_id in range(4):
            pull = dict(pull_header("devices", 0), queueId=str(queue_id))
            response = await raw.call(RequestCode.PULL_MESSAGE, signed(pull, b"", "mallory"))
            got += [m.body for m in decode_messages(response.body)] if response.code == 0 else []
        assert got == [b"fine"]
        assert gw.store.max_offset_now("t:devices/d1/cmd") == 0
        raw.close()
