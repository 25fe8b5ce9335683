"""The password file (Mosquitto's formats), the ACL (Mosquitto's acl_file rules), `tidemq passwd`,
and both enforced on real MQTT connections."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.auth import Access, Acl, AclError, AuthConfigError, PasswordFile
from protocols.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    Connect,
    Publish,
    Subscribe,
    Subscription,
    Will,
)
from protocols.mqtt.topics import covers, matches, overlaps

from .mqtt_support import RawClient, mqtt_port, running_gateway

ROOT = Path(__file__).resolve().parent.parent


def mosquitto_line(user: str, password: str, kind: str, salt: bytes = b"0123456789ab", iterations: int = 101) -> str:
    """A password line computed here, independently of the code under test."""
    if kind == "7":
        digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
        return f"{user}:$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"
    digest = hashlib.sha512(password.encode() + salt).digest()
    return f"{user}:$6${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def test_password_file_reads_mosquitto_formats_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_text("# users\n\n" + mosquitto_line("old", "s3cret", "6") + "\n" + mosquitto_line("new", "pw", "7") + "\n")
    users = PasswordFile.load(path)
    assert users.verify("old", "s3cret") and not users.verify("old", "S3cret")
    assert users.verify("new", "pw") and not users.verify("new", "")
    assert not users.verify("nobody", "pw")
    users.set("added", "hunter2", iterations=1000)
    users.save(path)
    assert path.stat().st_mode & 0o777 == 0o600
    again = PasswordFile.load(path)
    assert again.verify("added", "hunter2") and again.verify("old", "s3cret")
    assert path.read_text().count("$7$1000$") == 1


@pytest.mark.parametrize("line, message", [
    ("nocolon", "expected user:hash"),
    ("user:plaintext", "not a $6$ or $7$"),
    ("user:$7$x$abc$def", "not a $6$ or $7$"),
    (":$6$YWJj$YWJj", "user name"),
])
def test_bad_password_lines_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "passwd"
    path.write_text(mosquitto_line("ok", "x", "6") + "\n" + line + "\n")
    with pytest.raises(AuthConfigError, match=rf"passwd:2: .*{message[:12].replace('$', '[$]')}"):
        PasswordFile.load(path)


async def test_verify_async_remembers_successes() -> None:
    users = PasswordFile()
    users.set("u", "p", iterations=50_000)
    assert await users.verify_async("u", "p")
    assert await users.verify_async("u", "p")  # served from memory
    assert not await users.verify_async("u", "wrong")
    users.set("u", "new", iterations=1000)  # a changed password forgets what was remembered
    assert not await users.verify_async("u", "p")


ACL = """
# anonymous clients
topic read public/#

user alice
topic readwrite alice/#
topic deny alice/secret
topic write shared/in

user bob
topic read alice/+/status

pattern readwrite devices/%c/#
pattern read users/%u/inbox
"""


@pytest.fixture
def acl(tmp_path: Path) -> Acl:
    path = tmp_path / "acl"
    path.write_text(ACL)
    return Acl.load(path)


def test_acl_rules(acl: Acl) -> None:
    assert acl.allows_subscribe(None, "anon", "public/news")
    assert not acl.allows_publish(None, "anon", "public/news")
    assert not acl.allows_subscribe(None, "anon", "alice/x")
    assert acl.allows_publish("alice", "c1", "alice/a/b")
    assert not acl.allows_publish("alice", "c1", "alice/secret")  # deny wins
    assert acl.allows_subscribe("alice", "c1", "alice/#")  # allowed, deliveries checked one by one
    assert acl.checks_deliveries("alice", "c1") and not acl.allows_read("alice", "c1", "alice/secret")
    assert acl.allows_publish("alice", "c1", "shared/in") and not acl.allows_subscribe("alice", "c1", "shared/in")
    assert acl.allows_subscribe("bob", "c2", "alice/+/status")
    assert not acl.allows_subscribe("bob", "c2", "alice/#")  # not covered
    assert acl.allows_publish("bob", "dev7", "devices/dev7/temp")  # %c
    assert not acl.allows_publish("bob", "dev7", "devices/dev8/temp")
    assert acl.allows_subscribe("bob", "x", "users/bob/inbox")  # %u
    assert not acl.allows_subscribe(None, "x", "users//inbox")  # %u never applies to anonymous
    assert acl.allows_publish(None, "d1", "devices/d1/t")  # %c patterns apply to anonymous too
    assert not acl.allows_publish("carol", "c3", "alice/x")  # no rule: denied
    assert Acl.allow_all().allows_publish(None, "x", "anything")


@pytest.mark.parametrize("text", ["topic", "topic read", "frobnicate a", "topic read a/#/b", "user"])
def test_bad_acl_lines(tmp_path: Path, text: str) -> None:
    path = tmp_path / "acl"
    path.write_text("topic read ok\n" + text + "\n")
    with pytest.raises(AclError, match="acl:2:"):
        Acl.load(path)


filters = st.lists(st.sampled_from(["a", "b", "+", ""]), min_size=1, max_size=4).flatmap(
    lambda levels: st.sampled_from(["/".join(levels), "/".join(levels) + "/#"]))
topics = st.lists(st.sampled_from(["a", "b", "c", ""]), min_size=1, max_size=5).map("/".join)


@given(filters, filters, topics)
def test_covers_implies_matches(outer: str, inner: str, topic: str) -> None:
    if covers(outer, inner) and matches(inner, topic):
        assert matches(outer, topic)


@given(filters, filters, topics)
def test_overlaps_when_a_topic_matches_both(first: str, second: str, topic: str) -> None:
    if matches(first, topic) and matches(second, topic):
        assert overlaps(first, second) and overlaps(second, first)
    if overlaps(first, second):  # and the other way: some topic of the filters' levels matches both
        assert overlaps(second, first)


def test_acl_rights_for_principals_without_client_id_and_amqp_lines(tmp_path: Path) -> None:
    path = tmp_path / "acl"
    path.write_text(ACL + '\nuser dave\ntopic read #\ntopic deny alice/secret\namqp "^d\\." "^d\\." ".*"\n')
    acl = Acl.load(path)
    assert not acl.allows_publish("bob", None, "devices/x/t")  # no client id: no %c pattern
    assert acl.allows_subscribe("dave", None, "#")  # (MQTT then checks each message)
    assert not acl.allows_every("dave", None, Access.READ, "#")  # a deny rule touches it
    assert not acl.allows_every("dave", None, Access.READ, "alice/+")
    assert acl.allows_every("dave", None, Access.READ, "alice/open/#")
    rights = acl.amqp_permissions("dave")
    assert rights is not None and rights.allows("configure", "d.q") and not rights.allows("write", "x")
    assert acl.amqp_permissions("alice") is None  # no amqp line: no access to the vhost (as RabbitMQ)


@pytest.mark.parametrize("text", ['amqp ".*" ".*"', 'amqp "(" ".*" ".*"', 'amqp ".*" ".*" ".*"\namqp "" "" ""'])
def test_bad_amqp_lines(tmp_path: Path, text: str) -> None:
    path = tmp_path / "acl"
    path.write_text("user x\n" + text + "\n")
    with pytest.raises(AclError, match="acl:[23]: amqp|acl:3: a second"):
        Acl.load(path)


def passwd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway", "passwd", *args], cwd=ROOT, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)


def test_passwd_command(tmp_path: Path) -> None:
    path = tmp_path / "users"
    assert passwd(str(path), "alice", "pw").returncode == 2  # no file and no -c
    assert passwd("-c", "-b", str(path), "alice", "pw1").returncode == 0
    assert passwd("-b", str(path), "bob", "pw2").returncode == 0
    result = passwd(str(path), "carol")  # no terminal to ask on
    assert result.returncode == 2 and "use -b" in result.stderr
    users = PasswordFile.load(path)
    assert users.verify("alice", "pw1") and users.verify("bob", "pw2") and "carol" not in users
    assert passwd("-D", str(path), "alice").returncode == 0
    assert passwd("-D", str(path), "alice").returncode == 2
    assert "alice" not in PasswordFile.load(path) and "bob" in PasswordFile.load(path)


@pytest.fixture
def secured(tmp_path: Path) -> dict:
    users = PasswordFile()
    users.set("alice", "wonderland", iterations=1000)
    users.set("bob", "builder", iterations=1000)
    users.save(tmp_path / "passwd")
    (tmp_path / "acl").write_text(ACL)
    return {"password_file": str(tmp_path / "passwd"), "acl_file": str(tmp_path / "acl"), "allow_anonymous": False}


async def test_credentials_checked_at_connect(data_dir: Path, secured: dict) -> None:
    async with running_gateway(data_dir, **secured) as gw:
        port = mqtt_port(gw)
        for connect, code in [
            (Connect("a", MQTT_5, username="alice", password=b"wonderland"), 0),
            (Connect("a", MQTT_5, username="alice", password=b"wrong"), 0x86),
            (Connect("a", MQTT_5, username="mallory", password=b"x"), 0x86),
            (Connect("a", MQTT_5), 0x87),  # anonymous not allowed
            (Connect("a", MQTT_3_1_1, username="alice", password=b"wrong"), 0x86),  # 3.1.1 return code 4
            (Connect("a", MQTT_5, username="alice", password=b"wonderland", will=Will("bob/x", b"w")), 0x87),
        ]:
            client, ack = await RawClient.connected(port, connect)
            assert ack.reason_code == code, connect
            await client.close()


async def test_acl_enforced_on_publish_subscribe_and_delivery(data_dir: Path, secured: dict) -> None:
    async with running_gateway(data_dir, **secured) as gw:
        port = mqtt_port(gw)
        alice, _ = await RawClient.connected(port, Connect("a", MQTT_5, username="alice", password=b"wonderland"))
        bob, _ = await RawClient.connected(port, Connect("dev9", MQTT_5, username="bob", password=b"builder"))
        alice.send(Subscribe(1, [Subscription("alice/#", 1), Subscription("bob/#", 1)]))
        assert (await alice.recv()).reason_codes == [1, 0x87]
        bob.send(Publish("alice/x", b"no", 1, packet_id=1))  # bob may not write there
        assert (await bob.recv()).reason_code == 0x87
        bob.send(Publish("devices/dev9/t", b"own", 1, packet_id=2))  # %c pattern
        assert (await bob.recv()).reason_code == 0
        alice.send(Publish("alice/secret", b"hidden", 1, packet_id=3))
        assert (await alice.recv()).reason_code == 0x87  # deny wins for writes too
        admin, _ = await RawClient.connected(port, Connect("dev1", MQTT_5, username="bob", password=b"builder"))
        await admin.close()
        # deliveries of an allowed wildcard skip what a deny rule covers
        assert gw.mqtt is not None
        gw.mqtt.publish_internal([("alice/secret", b"s"), ("alice/open", b"o")])
        got = await alice.recv()
        assert (got.topic, got.payload) == ("alice/open", b"o")
        await alice.close()
        await bob.close()


def test_access_keys_file(tmp_path: Path) -> None:
    from gateway.auth.access_keys import AccessKeys

    path = tmp_path / "keys"
    path.write_text("# ak sk user\nAK1 sk1 alice\nAK2 sk2\n")
    keys = AccessKeys.load(path)
    assert len(keys) == 2
    for bad, message in [("AK1\n", "expected"), ("AK1 a\nAK1 b\n", "twice")]:
        path.write_text(bad)
        with pytest.raises(AuthConfigError, match=rf"keys:\d: .*{message}"):
            AccessKeys.load(path)


async def test_a_wildcard_in_a_client_id_does_not_widen_a_pattern(data_dir: Path, secured: dict) -> None:
    """`pattern readwrite devices/%c/#` for client id "+" would be devices/+/#, every device's
    topics: as Mosquitto (CVE-2017-7650), a pattern does not apply to a name with + or #."""
    async with running_gateway(data_dir, **secured) as gw:
        port = mqtt_port(gw)
        for client_id in ("+", "#", "a+b"):
            bob, ack = await RawClient.connected(port, Connect(client_id, MQTT_5, username="bob",
                                                               password=b"builder"))
            assert ack.reason_code == 0
            bob.send(Subscribe(1, [Subscription("devices/+/#", 1), Subscription("devices/dev9/#", 1)]))
            assert (await bob.recv()).reason_codes == [0x87, 0x87], client_id
            bob.send(Publish("devices/dev9/t", b"forged", 1, packet_id=2))
            assert (await bob.recv()).reason_code == 0x87, client_id
            await bob.close()
