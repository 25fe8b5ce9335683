"""The remoting listener under a password file and ACL (gateway/remoting/access.py): requests
signed as RocketMQ's ACL plugin does (ali-ons, the C++ client, and a signer written here from
the plugin's definition), the ACL on remoting reads and writes of MQTT topics (sends, the
``mqttSecondTopic`` property, pulls, view-by-id, query, send-back), the first-request timeout;
and timer and transactional messages refused, never delivered early."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from pathlib import Path

import pytest
from rocketmq import client as rmq
from rocketmq.exceptions import RocketMQException

from gateway.auth import PasswordFile
from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.properties import encode_properties
from store.holds.codec import HALF, TIMER
from tests.mqtt_support import PahoClient
from tests.remoting_support import ons, remoting_gateway
from tests.test_remoting_wire import RawRemoting, pull_header, send_header

ACL = """
user alice
topic readwrite #

user mallory
topic readwrite #
topic deny secret/#
topic deny devices/+/cmd
"""
KEYS = {"alice": ("AK-alice", "sk-alice-123"), "mallory": ("AK-mallory", "sk-mallory-456")}


@pytest.fixture
def secured(tmp_path: Path) -> dict:
    users = PasswordFile()
    users.set("alice", "pw-alice", iterations=1000)
    users.save(tmp_path / "passwd")
    (tmp_path / "acl").write_text(ACL)
    keys = tmp_path / "access_keys"
    keys.write_text("# AccessKey SecretKey user\n" + "".join(f"{ak} {sk} {user}\n" for user, (ak, sk) in KEYS.items()))
    keys.chmod(0o600)
    return {"password_file": str(tmp_path / "passwd"), "acl_file": str(tmp_path / "acl"),
            "access_keys_file": str(keys), "allow_anonymous": False}


def signed(ext: dict[str, str], body: bytes, user: str, secret: str | None = None) -> dict[str, str]:
    """RocketMQ's AclClientRPCHook, written from its definition: AccessKey added, the values
    sorted by field name concatenated, then the body; HmacSHA1, base64."""
    access_key, secret_key = KEYS[user]
    fields = {**ext, "AccessKey": access_key}
    content = "".join(fields[name] for name in sorted(fields)).encode() + body
    digest = hmac.new((secret or secret_key).encode(), content, hashlib.sha1).digest()
    return {**fields, "Signature": base64.b64encode(digest).decode()}


async def test_requests_must_be_signed(data_dir: Path, secured: dict) -> None:
    async with remoting_gateway(data_dir, **secured) as (_, addr):
        raw = await RawRemoting.open(addr)
        route = {"topic": "Signed"}
        assert (await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, route)).code == ResponseCode.NO_PERMISSION
        wrong = signed(route, b"", "alice", secret="not-the-secret")
        response = await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, wrong)
        assert response.code == ResponseCode.NO_PERMISSION and "signature" in response.remark
        unknown = {**signed(route, b"", "alice"), "AccessKey": "AK-nobody"}
        assert (await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, unknown)).code == ResponseCode.NO_PERMISSION
        assert (await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, signed(route, b"", "alice"))).code == 0
        body = b"signed body"
        ext = signed(send_header("Signed"), body, "alice")
        assert (await raw.call(RequestCode.SEND_MESSAGE, ext, body)).code == 0
        assert (await raw.call(RequestCode.SEND_MESSAGE, ext, b"another body")).code == ResponseCode.NO_PERMISSION
        raw.close()


async def test_ali_ons_signs_and_wrong_secret_is_refused(data_dir: Path, secured: dict) -> None:
    async with remoting_gateway(data_dir, **secured) as (gw, addr):
        ak, sk = KEYS["alice"]
        sent = await ons({"cmd": "send", "nameSrv": addr, "topic": "OnsSigned", "accessKey": ak, "secretKey": sk,
                          "messages": [{"tags": "A", "body": "hello"}]})
        assert [e["sendStatus"] for e in sent] == ["SEND_OK"]
        got = await ons({"cmd": "consume", "nameSrv": addr, "group": "GID-signed", "topic": "OnsSigned",
                         "accessKey": ak, "secretKey": sk, "count": 1, "fromFirst": True})
        assert [e["body"] for e in got if e["event"] == "message"] == ["hello"]
        with pytest.raises(AssertionError, match="ali-ons failed"):
            await ons({"cmd": "send", "nameSrv": addr, "topic": "OnsSigned", "accessKey": ak, "secretKey": "bad",
                       "messages": [{"body": "refused"}]}, timeout=40)
        assert gw.remoting.stats.auth_failures > 0


async def test_ali_ons_cannot_write_or_read_denied_mqtt_topics(data_dir: Path, secured: dict) -> None:
    async with remoting_gateway(data_dir, mqtt_bind="127.0.0.1:0", **secured) as (gw, addr):
        mqtt = next(listener.address[1] for listener in gw.listeners if listener.protocol == "mqtt")
        alice = PahoClient(mqtt, "alice-app", username="alice", password="pw-alice")
        await alice.connect()
        await alice.subscribe("#", 1)
        ak, sk = KEYS["mallory"]
        events = await ons({"cmd": "send", "nameSrv": addr, "topic": "devices", "accessKey": ak, "secretKey": sk,
                            "reportErrors": True, "messages": [
                                {"body": "reboot", "properties": {"mqttSecondTopic": "/d1/cmd"}},  # the bypass
                                {"body": "fine", "properties": {"mqttSecondTopic": "/d1/status"}}]})
        assert [e["event"] for e in events] == ["error", "sent"]
        events = await ons({"cmd": "send", "nameSrv": addr, "topic": "secret", "accessKey": ak, "secretKey": sk,
                            "reportErrors": True, "messages": [{"body": "leak"}]})
        assert [e["event"] for e in events] == ["error"]
        got = await alice.receive(1)
        assert [(m.topic, m.payload) for m in got] == [("devices/d1/status", b"fine")]
        await alice.nothing_more()
        # reads: mallory's consumer of the remoting topic "devices" skips what the ACL denies
        consumer = await ons_consumer(addr, "mallory", "devices")
        await alice.publish("devices/d2/cmd", b"hidden", 1)
        await alice.publish("devices/d2/status", b"visible", 1)
        events = await consumer
        # (a new group starts at the queues' first messages: "fine" from above, which it may read)
        assert sorted(e["body"] for e in events if e["event"] == "message") == ["fine", "visible"]
        await alice.disconnect()


async def ons_consumer(addr: str, user: str, topic: str):
    from tests.remoting_support import OnsProcess

    ak, sk = KEYS[user]
    process = await OnsProcess.start({"cmd": "consume", "nameSrv": addr, "group": f"GID-{user}", "topic": topic,
                                      "accessKey": ak, "secretKey": sk, "count": 3, "timeoutMs": 5000})
    await process.until("ready")

    async def finish():
        try:
            return await process.finish()
        finally:
            process.kill()
    return asyncio.ensure_future(finish())


async def test_view_query_and_send_back_of_denied_messages_refused(data_dir: Path, secured: dict) -> None:
    async with remoting_gateway(data_dir, **secured) as (gw, addr):
        raw = await RawRemoting.open(addr)
        body = b"top secret"
        props = encode_properties({"KEYS": "k-secret"})  # (MQTT topic "secret": denied by secret/#)
        sent = await raw.call(RequestCode.SEND_MESSAGE, signed(send_header("secret", properties=props), body, "alice"),
                              body)
        assert sent.code == 0
        position = gw.store.get_now("r:secret:0", 0, 1).messages[0].position
        view = {"offset": str(position)}
        assert (await raw.call(RequestCode.VIEW_MESSAGE_BY_ID, signed(view, b"", "alice"))).code == 0
        assert (await raw.call(RequestCode.VIEW_MESSAGE_BY_ID, signed(view, b"", "mallory"))).code == \
            ResponseCode.NO_PERMISSION
        query = {"topic": "secret", "key": "k-secret", "maxNum": "32", "beginTimestamp": "0",
                 "endTimestamp": str(1 << 60)}
        assert (await raw.call(RequestCode.QUERY_MESSAGE, signed(query, b"", "alice"))).code == 0
        assert (await raw.call(RequestCode.QUERY_MESSAGE, signed(query, b"", "mallory"))).code == \
            ResponseCode.NO_PERMISSION  # (no right under "secret"; one found but not readable: not found)
        back = {"group": "GID-m", "offset": str(position), "delayLevel": "0", "originMsgId": "x",
                "originTopic": "secret", "maxReconsumeTimes": "16"}
        assert (await raw.call(RequestCode.CONSUMER_SEND_MSG_BACK, signed(back, b"", "mallory"))).code == \
            ResponseCode.NO_PERMISSION
        pull = await raw.call(RequestCode.PULL_MESSAGE, signed(pull_header("secret", 0), b"", "mallory"))
        assert pull.code == ResponseCode.NO_PERMISSION  # (test_remoting_request_rights.py: what each request needs)
        assert (await raw.call(RequestCode.PULL_MESSAGE, signed(pull_header("secret", 0), b"", "alice"))).body
        # alice's retry of it: the retry topic is not an MQTT topic, its message still is secret
        back.update(group="GID-a", delayLevel="1")
        assert (await raw.call(RequestCode.CONSUMER_SEND_MSG_BACK, signed(back, b"", "alice"))).code == 0
        retry = pull_header("%RETRY%GID-a", 0, suspend_ms=5000)
        got = await raw.call(RequestCode.PULL_MESSAGE, signed(retry, b"", "alice"))
        assert got.code == 0 and body in got.body
        pull = await raw.call(RequestCode.PULL_MESSAGE, signed(retry, b"", "mallory"))
        assert pull.code == ResponseCode.PULL_RETRY_IMMEDIATELY and not pull.body
        raw.close()


async def _pop_clients(addr: str, users: tuple[str, ...], group: str = "GID-pop") -> dict:
    """Pop consumers of ``group`` signing as ``users``."""
    from tests.pop_support import PopClient

    clients = {}
    for user in users:
        client = clients[user] = await PopClient.open(addr, group)
        call = client.raw.call
        client.raw.call = (lambda call, user: lambda code, ext=None, body=b"", **kw: call(
            code, signed(ext or {}, body, user), body, **kw))(call, user)
    return clients


async def _send_devices(raw, *seconds: str) -> None:
    """To remoting topic "devices", MQTT topics devices/d1/cmd (denied to mallory) or
    devices/d1/status (which she may read: she may pop from "devices")."""
    for second in seconds:
        header = send_header("devices", properties=encode_properties({"mqttSecondTopic": second}))
        sent = await raw.call(RequestCode.SEND_MESSAGE, header, second.encode())
        assert sent.code == 0, sent.remark


async def test_a_popped_message_a_member_may_not_read_waits_for_a_member_that_may(data_dir: Path,
                                                                                  secured: dict) -> None:
    """Pop: a message mallory may not read, new or come back to the group, is left for alice,
    a member of the group (by her heartbeat) that may read it: mallory gets only what she may."""
    async with remoting_gateway(data_dir, **secured) as (gw, addr):
        clients = await _pop_clients(addr, ("alice", "mallory"))
        for user, client in clients.items():
            assert (await client.heartbeat("devices", f"client-{user}")).code == 0
        await _send_devices(clients["alice"].raw, "/d1/cmd", "/d1/status")
        assert [p.body for p in await clients["mallory"].pop("devices")] == [b"/d1/status"]
        assert [p.body for p in await clients["alice"].pop("devices")] == [b"/d1/cmd"]
        # one alice popped and did not ack comes back to the group: mallory leaves it too
        await _send_devices(clients["alice"].raw, "/d1/cmd")
        assert [p.body for p in await clients["alice"].pop("devices", invisible_ms=200)] == [b"/d1/cmd"]
        for _ in range(100):
            if gw.remoting.pop.revived == 1:
                break
            await asyncio.sleep(0.1)
        assert gw.remoting.pop.revived == 1
        assert await clients["mallory"].pop("devices", poll_ms=500) == []
        assert [p.body for p in await clients["alice"].pop("devices")] == [b"/d1/cmd"]
        for client in clients.values():
            client.raw.close()


async def test_a_popped_message_no_member_may_read_is_passed_over(data_dir: Path, secured: dict) -> None:
    """Pop: a message alice popped and did not ack comes back to the group; mallory, the only
    member of the group (alice sent no heartbeat), pops it only if the ACL lets her read it
    (here not: it is passed over, as a new one she may not read is)."""
    async with remoting_gateway(data_dir, **secured) as (gw, addr):
        clients = await _pop_clients(addr, ("alice", "mallory"))
        assert (await clients["mallory"].heartbeat("devices", "client-mallory")).code == 0
        await _send_devices(clients["alice"].raw, "/d1/cmd", "/d1/status")
        popped = await clients["alice"].pop("devices", invisible_ms=200)
        assert sorted(p.body for p in popped) == [b"/d1/cmd", b"/d1/status"]
        for _ in range(100):  # past their invisible time, both come back to the group
            if gw.remoting.pop.revived == 2:
                break
            await asyncio.sleep(0.1)
        assert gw.remoting.pop.revived == 2
        assert [p.body for p in await clients["mallory"].pop("devices", poll_ms=2000)] == [b"/d1/status"]
        await _send_devices(clients["alice"].raw, "/d1/cmd", "/d1/status")
        assert [p.body for p in await clients["mallory"].pop("devices", poll_ms=2000)] == [b"/d1/status"]
        assert await clients["mallory"].pop("devices", poll_ms=500) == []
        assert await clients["alice"].pop("devices", poll_ms=500) == []  # (nothing left over)
        for client in clients.values():
            client.raw.close()


@pytest.mark.usefixtures("rocketmq_home")
async def test_cpp_client_signs_with_session_credentials(data_dir: Path, secured: dict) -> None:
    async with remoting_gateway(data_dir, **secured) as (gw, addr):
        def send(user: str, secret: str | None, topic: str, second: str | None = None) -> str:
            producer = rmq.Producer(f"PID-{user}-{secret is None}")
            producer.set_namesrv_addr(addr)
            producer.set_session_credentials(KEYS[user][0], secret or KEYS[user][1], "ALIYUN")
            producer.set_timeout(3000)
            producer.start()
            try:
                message = rmq.Message(topic)
                message.set_body(b"from c++")
                if second:
                    message.set_property("mqttSecondTopic", second)
                try:
                    return producer.send_sync(message).status.name
                except RocketMQException as exc:
                    return f"failed: {exc}"
            finally:
                producer.shutdown()

        assert await asyncio.to_thread(send, "alice", None, "CppSigned") == "OK"
        assert (await asyncio.to_thread(send, "mallory", None, "devices", "/d1/cmd")).startswith("failed")
        assert (await asyncio.to_thread(send, "alice", "wrong-secret", "CppSigned")).startswith("failed")
        assert gw.store.max_offset_now("t:devices/d1/cmd") == 0


# -- the first request, timers and transactions ---------------------------------------------
async def test_silent_connection_closed_after_connect_timeout(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, connect_timeout_s=0.5, mqtt_bind="127.0.0.1:0",
                                amqp_bind="127.0.0.1:0") as (gw, addr):
        silent = await RawRemoting.open(addr)
        talking = await RawRemoting.open(addr)
        assert (await talking.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})).code == 0
        assert await silent.closed()
        for protocol in ("mqtt", "amqp"):  # the same setting on every listener
            port = next(listener.address[1] for listener in gw.listeners if listener.protocol == protocol)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(), 5.0) == b"", protocol
            writer.close()
        await asyncio.sleep(1.0)  # past the timeout: the one that spoke stays
        assert (await talking.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})).code == 0
        talking.close()


@pytest.mark.parametrize("timer", [
    ("__STARTDELIVERTIME", "at"), ("TIMER_DELIVER_MS", "at"), ("TIMER_DELAY_SEC", "3"), ("TIMER_DELAY_MS", "3000"),
])
async def test_timer_messages_are_stored_now_and_delivered_at_their_time_with_ali_ons(data_dir: Path,
                                                                                       timer: tuple) -> None:
    name, value = timer
    async with remoting_gateway(data_dir) as (gw, addr):
        sent_at = time.time()
        if value == "at":
            value = str(int(sent_at * 1000) + 3000)
        events = await ons({"cmd": "send", "nameSrv": addr, "topic": "Later", "reportErrors": True,
                            "messages": [{"body": "soon", "properties": {name: value}}, {"body": "now"}]})
        assert [e["event"] for e in events] == ["sent", "sent"]

        def stored() -> list[bytes]:
            return [m.body for q in range(4) for m in gw.store.get_now(f"r:Later:{q}", 0, 10).messages]

        assert stored() == [b"now"] and gw.store.held.count(TIMER) == 1
        deadline = time.monotonic() + 10
        while stored() == [b"now"] and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert sorted(stored()) == [b"now", b"soon"] and time.time() - sent_at >= 3.0
        (held,) = [m for q in range(4) for m in gw.store.get_now(f"r:Later:{q}", 0, 10).messages if m.body == b"soon"]
        assert name in held.properties and int(held.properties["TIMER_OUT_MS"]) >= int(sent_at * 1000) + 3000


@pytest.mark.parametrize("properties", [
    {"TIMER_DELAY_SEC": "soon"}, {"TIMER_DELIVER_MS": "4102444800000", "DELAY": "3"},
])
async def test_bad_timer_messages_refused_with_ali_ons(data_dir: Path, properties: dict) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        events = await ons({"cmd": "send", "nameSrv": addr, "topic": "Later", "reportErrors": True,
                            "messages": [{"body": "not now", "properties": properties}, {"body": "now"}]})
        assert [(e["event"], e.get("code")) for e in events] == [("error", ResponseCode.MESSAGE_ILLEGAL), ("sent", None)]
        assert "timer message illegal" in events[0]["message"] or "not both" in events[0]["message"]
        stored = [m.body for q in range(4) for m in gw.store.get_now(f"r:Later:{q}", 0, 10).messages]
        assert stored == [b"now"] and gw.store.held.count(TIMER) == 0


@pytest.mark.usefixtures("rocketmq_home")
async def test_timer_message_taken_from_cpp_client_and_half_messages_held(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        def send() -> str:
            producer = rmq.Producer("PID-timer")
            producer.set_namesrv_addr(addr)
            producer.start()
            try:
                message = rmq.Message("CppLater")
                message.set_body(b"in a minute")
                message.set_property("TIMER_DELAY_SEC", "60")
                try:
                    return producer.send_sync(message).status.name
                except RocketMQException as exc:
                    return f"failed: {exc}"
            finally:
                producer.shutdown()

        assert await asyncio.to_thread(send) == "OK"
        assert gw.store.held.count(TIMER) == 1  # held for its minute
        raw = await RawRemoting.open(addr)
        end = {"producerGroup": "tx", "tranStateTableOffset": "0", "commitLogOffset": "0", "commitOrRollback": "12",
               "fromTransactionCheck": "false", "msgId": "x", "transactionId": "y"}
        missing = await raw.call(RequestCode.END_TRANSACTION, end)  # (test_remoting_transactions.py: the rest)
        assert (missing.code, missing.remark) == (ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed")
        body = b"half"
        half = send_header("CppLater", properties=encode_properties({"TRAN_MSG": "true"}))
        assert (await raw.call(RequestCode.SEND_MESSAGE, half, body)).code == ResponseCode.SUCCESS
        assert gw.store.held.count(HALF) == 1  # held until its transaction ends
        wildcard = send_header("CppLater", properties=encode_properties({"mqttSecondTopic": "/+/x"}))
        assert (await raw.call(RequestCode.SEND_MESSAGE, wildcard, body)).code == ResponseCode.MESSAGE_ILLEGAL
        raw.close()
        assert all(gw.store.max_offset_now(f"r:CppLater:{q}") == 0 for q in range(4))



async def test_sends_to_retry_and_dlq_topics_need_read_on_the_topic_they_were_first_on(data_dir: Path,
                                                                                     secured: dict) -> None:
    """A send straight to a group's %RETRY% or %DLQ% topic (the Java consumer's fallback when its
    send-back fails) needs what the send-back needs: read on the topic the message was first on,
    which its RETRY_TOPIC property names; the group's readers are then checked by that topic. An
    MQTT publish to a topic named like one does not reach it."""
    async with remoting_gateway(data_dir, mqtt_bind="127.0.0.1:0", **secured) as (gw, addr):
        raw = await RawRemoting.open(addr)

        async def send(user: str, topic: str, body: bytes, code=RequestCode.SEND_MESSAGE, **props: str) -> int:
            header = send_header(topic, properties=encode_properties(props) if props else "")
            return (await raw.call(code, signed(header, body, user), body)).code

        for topic in ("%RETRY%GID-victim", "%DLQ%GID-victim"):
            assert await send("mallory", topic, b"forged") == ResponseCode.NO_PERMISSION
            assert await send("mallory", topic, b"forged", RETRY_TOPIC="secret") == ResponseCode.NO_PERMISSION
            assert await send("mallory", topic, b"forged", RETRY_TOPIC="devices",
                              mqttSecondTopic="/d1/cmd") == ResponseCode.NO_PERMISSION
            assert await send("alice", topic, b"secret retry", RETRY_TOPIC="secret") == 0
            assert await send("mallory", topic, b"status retry", RETRY_TOPIC="devices",
                              mqttSecondTopic="/d1/status") == 0
        assert gw.store.max_offset_now("r:%RETRY%GID-victim:0") == 2
        # what the group's members may pull: by the topic each message was first on
        retry = pull_header("%RETRY%GID-victim", 0)
        got = await raw.call(RequestCode.PULL_MESSAGE, signed(retry, b"", "mallory"))
        assert got.code == 0 and b"status retry" in got.body and b"secret retry" not in got.body
        got = await raw.call(RequestCode.PULL_MESSAGE, signed(retry, b"", "alice"))
        assert got.code == 0 and b"status retry" in got.body and b"secret retry" in got.body
        # MQTT topic "%RETRY%GID-victim" (alice may write any) is no remoting topic, the group's
        # retry topic made (again) by a consumer's heartbeat or not
        victim = (await _pop_clients(addr, ("alice",), "GID-victim"))["alice"]
        assert (await victim.heartbeat("devices", "client-victim")).code == 0
        victim.close()
        mqtt = PahoClient(next(lsn.address[1] for lsn in gw.listeners if lsn.protocol == "mqtt"), "alice-mqtt",
                          username="alice", password="pw-alice")
        await mqtt.connect()
        await mqtt.publish("%RETRY%GID-victim", b"from mqtt", 1)
        await mqtt.disconnect()
        assert sum(gw.store.max_offset_now(f"r:%RETRY%GID-victim:{i}") for i in range(8)) == 2
        raw.close()
