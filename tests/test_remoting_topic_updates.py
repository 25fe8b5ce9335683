"""UPDATE_AND_CREATE_TOPIC on a topic that exists (gateway/remoting/topic_updates.py), over a
real socket and through ali-ons' createTopic: queue counts grown (as mqadmin updateTopic does)
and the route, sends and pulls following; permissions changed; what cannot be honoured --
read queues that still hold messages dropped, settings not built -- refused with SYSTEM_ERROR
and a remark, the topic left as it was; under an ACL, a change needs write on all the topic."""

from __future__ import annotations

import json
from pathlib import Path

from protocols.remoting.codes import RequestCode, ResponseCode
from tests.mqtt_support import PahoClient, mqtt_port
from tests.remoting_support import RawRemoting, ons, pull_header, remoting_gateway, send_header
from tests.test_remoting_access import secured, signed

__all__ = ["secured"]  # (the fixture: a password file, the ACL, access keys)


def topic_header(topic: str, read: int, write: int, perm: int = 6, **extra: str) -> dict[str, str]:
    """mqadmin updateTopic's header (CreateTopicRequestHeader)."""
    return {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(read), "writeQueueNums": str(write),
            "perm": str(perm), "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false", **extra}


async def route(raw: RawRemoting, topic: str) -> tuple[int, int, int]:
    response = await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    assert response.code == ResponseCode.SUCCESS, response.remark
    queues = json.loads(response.body)["queueDatas"][0]
    return queues["readQueueNums"], queues["writeQueueNums"], queues["perm"]


async def test_growing_the_queues_of_a_topic(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        raw = await RawRemoting.open(addr)
        try:
            assert await route(raw, "Orders") == (4, 4, 6)  # created by the lookup
            response = await raw.call(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_header("Orders", 8, 8))
            assert (response.code, response.remark) == (ResponseCode.SUCCESS, None)
            assert await route(raw, "Orders") == (8, 8, 6)
            sent = await raw.call(RequestCode.SEND_MESSAGE, send_header("Orders", 7), b"to queue 7")
            assert sent.code == ResponseCode.SUCCESS and sent.ext_fields["queueId"] == "7"
            pulled = await raw.call(RequestCode.PULL_MESSAGE, {**pull_header("Orders", 0), "queueId": "7"})
            assert pulled.code == ResponseCode.SUCCESS
            # read queues grown before write queues (a consumer rebalances over them first)
            response = await raw.call(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_header("Orders", 12, 8))
            assert response.code == ResponseCode.SUCCESS
            assert await route(raw, "Orders") == (12, 8, 6)
        finally:
            raw.close()
    async with remoting_gateway(data_dir) as (gw, addr):  # kept in the store
        assert (gw.remoting.topics.get("Orders").read_queues, gw.remoting.topics.get("Orders").write_queues) == (12, 8)


async def test_mqtt_publishes_follow_the_change(data_dir: Path) -> None:
    """An MQTT topic under a remoting topic lands in the queue its hash picks among the write
    queues as they are now; none when the topic is no longer readable."""
    async with remoting_gateway(data_dir, mqtt_bind="127.0.0.1:0") as (gw, addr):
        raw = await RawRemoting.open(addr)
        mqtt = PahoClient(mqtt_port(gw), "publisher")
        await mqtt.connect()
        try:
            assert await route(raw, "Sensors") == (4, 4, 6)
            await mqtt.publish("Sensors/s0", b"of 4 queues", qos=1)  # crc32 % 4 == 3
            assert (await raw.call(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_header("Sensors", 8, 8))).code == 0
            await mqtt.publish("Sensors/s0", b"of 8 queues", qos=1)  # crc32 % 8 == 7
            assert [gw.store.max_offset_now(f"r:Sensors:{q}") for q in (3, 7)] == [1, 1]
            assert (await raw.call(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_header("Sensors", 8, 8, 2))).code == 0
            await mqtt.publish("Sensors/s0", b"write-only", qos=1)
            assert [gw.store.max_offset_now(f"r:Sensors:{q}") for q in (3, 7)] == [1, 1]
            assert gw.store.max_offset_now("t:Sensors/s0") == 3
        finally:
            await mqtt.disconnect()
            raw.close()


async def test_permissions_changed_and_honoured(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        raw = await RawRemoting.open(addr)
        try:
            assert (await raw.call(RequestCode.SEND_MESSAGE, send_header("Audit"), b"before")).code == 0
            response = await raw.call(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_header("Audit", 4, 4, perm=4))
            assert response.code == ResponseCode.SUCCESS
            assert await route(raw, "Audit") == (4, 4, 4)
            refused = await raw.call(RequestCode.SEND_MESSAGE, send_header("Audit"), b"after")
            assert refused.code == ResponseCode.NO_PERMISSION
            assert (await raw.call(RequestCode.PULL_MESSAGE, pull_header("Audit", 0))).code == ResponseCode.SUCCESS
        finally:
            raw.close()


async def test_what_cannot_be_honoured_is_refused_and_changes_nothing(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        raw = await RawRemoting.open(addr)
        try:
            assert (await raw.call(RequestCode.SEND_MESSAGE, send_header("Kept", 3), b"in queue 3")).code == 0
            refusals = []
            for header in (
                topic_header("Kept", 2, 2),  # queue 3 holds a message
                topic_header("Kept", 4, 8),  # written queues no consumer reads
                topic_header("Kept", 0, 0),
                topic_header("Kept", 5000, 5000),
                topic_header("Kept", 4, 4, perm=7),
                topic_header("Kept", 4, 4, topicFilterType="MULTI_TAG"),
                topic_header("Kept", 4, 4, topicSysFlag="1"),
                topic_header("Kept", 4, 4, order="true"),
                topic_header("Kept", 4, 4, attributes="+message.type=FIFO"),
                topic_header("Kept", 4, 4, perm="rw"),
            ):
                response = await raw.call(RequestCode.UPDATE_AND_CREATE_TOPIC, header)
                refusals.append((response.code, response.remark))
            assert refusals == [(ResponseCode.SYSTEM_ERROR, remark) for remark in (
                "readQueueNums 2 below 4: queue 3 of Kept still holds messages (lower writeQueueNums first; "
                "readQueueNums once retention has removed them)",
                "writeQueueNums 8 above readQueueNums 4: messages would go to queues no consumer reads",
                "readQueueNums 0 is not within 1..1024",
                "readQueueNums 5000 is not within 1..1024",
                "perm 7 is not built: only PERM_READ (4) and PERM_WRITE (2)",
                "topicFilterType MULTI_TAG is not built: only SINGLE_TAG",
                "topicSysFlag (unit topics) is not built: only 0",
                "ordered topic configs are not built: send ordered messages with a queue selector or a "
                "sharding key",
                "topic attributes are not built: +message.type=FIFO",
                "the request header field perm is not a number: 'rw'",
            )]
            assert await route(raw, "Kept") == (4, 4, 6)
            # fewer write queues keep every message readable; then the empty read queues can go
            assert (await raw.call(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_header("Kept", 4, 3))).code == 0
            assert (await raw.call(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_header("Kept", 4, 2))).code == 0
            refused = await raw.call(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_header("Kept", 3, 2))
            assert refused.code == ResponseCode.SYSTEM_ERROR
            assert "queue 3 of Kept still holds messages" in refused.remark
            assert await route(raw, "Kept") == (4, 2, 6)
            assert (await raw.call(RequestCode.SEND_MESSAGE, send_header("Empty"), b"x")).code == 0  # queue 0
            assert (await raw.call(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_header("Empty", 1, 1))).code == 0
            assert await route(raw, "Empty") == (1, 1, 6)
        finally:
            raw.close()


async def test_ali_ons_create_topic_creates_and_grows(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        def config(queues: int, **extra) -> dict:
            return {"topicName": "OnsMade", "readQueueNums": queues, "writeQueueNums": queues, "perm": 6,
                    "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False, **extra}

        calls = [["createTopic", "$broker", "TBW102", config(2), 3000],
                 ["createTopic", "$broker", "TBW102", config(6), 3000],
                 ["createTopic", "$broker", "TBW102", config(6, order=True), 3000]]
        events = await ons({"cmd": "api", "nameSrv": addr, "calls": calls})
        results = [(e["event"], e.get("code")) for e in events if e["event"] in ("result", "error")]
        assert results == [("result", None), ("result", None), ("error", ResponseCode.SYSTEM_ERROR)], events
        topic = gw.remoting.topics.get("OnsMade")
        assert (topic.read_queues, topic.write_queues, topic.perm) == (6, 6, 6)


async def test_a_change_needs_write_on_all_the_topic(data_dir: Path, secured: dict) -> None:
    """A deny rule of mallory's lies under ``devices`` (devices/+/cmd): she may create it as a
    lookup would, not change it; alice may. All of ``public`` is mallory's to write and change."""
    async with remoting_gateway(data_dir, **secured) as (gw, addr):
        raw = await RawRemoting.open(addr)
        try:
            async def update(user: str, queues: int, topic: str = "devices") -> int:
                header = signed(topic_header(topic, queues, queues), b"", user)
                return (await raw.call(RequestCode.UPDATE_AND_CREATE_TOPIC, header)).code

            assert await update("mallory", 4) == ResponseCode.SUCCESS  # created as a lookup would: no change
            assert await update("mallory", 8) == ResponseCode.NO_PERMISSION
            assert gw.remoting.topics.get("devices").read_queues == 4
            assert await update("alice", 8) == ResponseCode.SUCCESS
            assert gw.remoting.topics.get("devices").read_queues == 8
            assert await update("mallory", 8, "public") == ResponseCode.SUCCESS  # (all of public/# is hers to write)
        finally:
            raw.close()
