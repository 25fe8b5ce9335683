"""One ACL for every protocol (gateway/auth/authorize.py), through real clients: a user the ACL
denies ``secret/#`` cannot write there or read from there over AMQP either (pika and kombu:
publish to amq.topic, queue.bind, exchange.bind, dead-lettering into amq.topic), AMQP's own
configure/write/read permissions, and refusals counted and logged once per interval."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import amqp.exceptions
import kombu
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from gateway.auth import PasswordFile

from .mqtt_support import PahoClient, mqtt_port, running_gateway

ACL = r"""
user alice
topic readwrite #
amqp ".*" ".*" ".*"

user mallory
topic readwrite #
topic deny secret/#
amqp ".*" ".*" ".*"

user carol
topic readwrite public/#
amqp "^carol\." "^carol\.|^amq\.topic$" "^carol\.|^amq\.topic$"

user dan
topic readwrite #
amqp "^dan\." "^dan\.x$" ""

user erin
topic readwrite #
"""


@pytest.fixture
def secured(tmp_path: Path) -> dict:
    users = PasswordFile()
    for name in ("alice", "mallory", "carol", "dan", "erin"):
        users.set(name, "pw-" + name, iterations=1000)
    users.save(tmp_path / "passwd")
    (tmp_path / "acl").write_text(ACL)
    return {"password_file": str(tmp_path / "passwd"), "acl_file": str(tmp_path / "acl"), "allow_anonymous": False,
            "amqp_bind": "127.0.0.1:0"}


def amqp_port(gw) -> int:
    return next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")


def pika_connection(gw, user: str) -> pika.BlockingConnection:
    credentials = pika.PlainCredentials(user, "pw-" + user)
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", amqp_port(gw), credentials=credentials,
                                                             blocked_connection_timeout=10))


def refused(call) -> int:
    """The reply code of the channel close ``call`` ends in (0: it was not refused)."""
    try:
        call()
    except ChannelClosedByBroker as exc:
        return exc.reply_code
    return 0


def closed_with(call) -> tuple[int, str]:
    """The reply code and text of the channel close ``call`` ends in ((0, ""): not refused)."""
    try:
        call()
    except ChannelClosedByBroker as exc:
        return exc.reply_code, exc.reply_text
    return 0, ""


async def subscriber(gw, user: str = "alice") -> PahoClient:
    client = PahoClient(mqtt_port(gw), f"{user}-sub", username=user, password="pw-" + user)
    await client.connect()
    await client.subscribe("#", 1)
    return client


# -- the bypasses through pika ---------------------------------------------------------------------
async def test_pika_publish_to_denied_topic_refused_and_not_delivered(data_dir: Path, secured: dict) -> None:
    async with running_gateway(data_dir, **secured) as gw:
        sub = await subscriber(gw)

        def publish() -> tuple[int, int]:
            conn = pika_connection(gw, "mallory")
            ch = conn.channel()
            ch.confirm_delivery()
            denied = refused(lambda: ch.basic_publish("amq.topic", "secret.amqp", b"leak"))
            ch = conn.channel()  # no MQTT topic name, but AMQP bindings "secret.*" would take it
            ch.confirm_delivery()
            denied += refused(lambda: ch.basic_publish("amq.topic", "secret.+", b"leak"))
            ch = conn.channel()
            ch.confirm_delivery()
            allowed = refused(lambda: ch.basic_publish("amq.topic", "public.amqp", b"fine"))
            conn.close()
            return denied, allowed

        assert await asyncio.to_thread(publish) == (403 + 403, 0)
        got = await sub.receive(1)
        assert [(m.topic, m.payload) for m in got] == [("public/amqp", b"fine")]
        await sub.nothing_more()
        assert gw.store.max_offset_now("t:secret/amqp") == 0  # never stored
        assert gw.authorizer.stats.denied[("amqp", "publish")] == 2
        await sub.disconnect()


async def test_pika_binding_to_denied_topics_refused(data_dir: Path, secured: dict) -> None:
    async with running_gateway(data_dir, **secured) as gw:
        def bind() -> list[int]:
            conn = pika_connection(gw, "mallory")
            codes = []
            for key in ("secret.#", "#", "*.x", "secret.a.b"):  # each reaches secret/... topics
                ch = conn.channel()
                ch.queue_declare("mq")
                codes.append(refused(lambda ch=ch, key=key: ch.queue_bind("mq", "amq.topic", key)))
            ch = conn.channel()
            ch.exchange_declare("mx", "topic")  # an exchange bound to amq.topic reads it too
            codes.append(refused(lambda: ch.exchange_bind("mx", "amq.topic", "secret.#")))
            ch = conn.channel()  # a dead letter into amq.topic could take any routing key
            codes.append(refused(lambda: ch.queue_declare("dl", arguments={"x-dead-letter-exchange": "amq.topic"})))
            ch = conn.channel()
            codes.append(refused(lambda: ch.queue_declare("dl2", arguments={
                "x-dead-letter-exchange": "amq.topic", "x-dead-letter-routing-key": "public.dead"})))
            codes.append(refused(lambda: ch.queue_bind("mq", "amq.topic", "public.#")))
            conn.close()
            return codes

        assert await asyncio.to_thread(bind) == [403, 403, 403, 403, 403, 403, 0, 0]
        publisher = PahoClient(mqtt_port(gw), "alice-pub", username="alice", password="pw-alice")
        await publisher.connect()
        await publisher.publish("secret/plans", b"hidden", 1)
        await publisher.publish("public/news", b"open", 1)

        def drain() -> list[tuple[str, bytes]]:
            conn = pika_connection(gw, "mallory")
            ch = conn.channel()
            got = []
            for _ in range(100):
                method, _, body = ch.basic_get("mq", auto_ack=True)
                if method is not None:
                    got.append((method.routing_key, body))
                elif got:
                    break
                else:
                    conn.sleep(0.05)
            conn.close()
            return got

        assert await asyncio.to_thread(drain) == [("public.news", b"open")]
        await publisher.disconnect()


async def test_pika_other_users_routes_into_and_out_of_denied_topics_refused(data_dir: Path, secured: dict) -> None:
    """What alice may set up (her queue of secret/#, exchanges fed by or feeding amq.topic) does not
    open secret topics to mallory, whatever AMQP permissions she has on alice's resources."""
    async with running_gateway(data_dir, **secured) as gw:
        def run() -> list[int]:
            alice = pika_connection(gw, "alice").channel()
            alice.queue_declare("alice.secret")
            alice.queue_bind("alice.secret", "amq.topic", "secret.#")
            alice.exchange_declare("alice.out", "topic")
            alice.exchange_bind("alice.out", "amq.topic", "secret.#")
            alice.exchange_declare("alice.in", "fanout")
            alice.exchange_bind("amq.topic", "alice.in", "")
            conn = pika_connection(gw, "mallory")
            codes = []
            for call in (
                lambda ch: ch.basic_get("alice.secret"),
                lambda ch: ch.basic_consume("alice.secret", lambda *a: None),
                lambda ch: ch.queue_purge("alice.secret"),  # (read, as RabbitMQ: its messages are gone)
                lambda ch: (ch.queue_declare("mq2"), ch.queue_bind("mq2", "alice.out", "#")),
                lambda ch: ch.basic_publish("alice.in", "secret.via.fanout", b"leak"),
                lambda ch: ch.basic_publish("alice.in", "public.via.fanout", b"fine"),
            ):
                ch = conn.channel()
                ch.confirm_delivery()
                codes.append(refused(lambda call=call, ch=ch: call(ch)))
            conn.close()
            return codes

        assert await asyncio.to_thread(run) == [403, 403, 403, 403, 403, 0]


# -- the same through kombu -----------------------------------------------------------------------
def kombu_connection(gw, user: str) -> kombu.Connection:
    return kombu.Connection(f"amqp://{user}:pw-{user}@127.0.0.1:{amqp_port(gw)}//",
                            transport_options={"confirm_publish": True})


async def test_kombu_publish_and_bind_to_denied_topics_refused(data_dir: Path, secured: dict) -> None:
    async with running_gateway(data_dir, **secured) as gw:
        sub = await subscriber(gw)
        topic_exchange = kombu.Exchange("amq.topic", type="topic", durable=True)

        def publish(key: str) -> int:
            with kombu_connection(gw, "mallory") as conn:
                try:
                    conn.Producer(exchange=topic_exchange).publish(b"via kombu", routing_key=key)
                except amqp.exceptions.AccessRefused as exc:
                    return exc.code
            return 0

        def bind(key: str) -> int:
            with kombu_connection(gw, "mallory") as conn:
                try:
                    kombu.Queue("kq", exchange=topic_exchange, routing_key=key)(conn.default_channel).declare()
                except amqp.exceptions.AccessRefused as exc:
                    return exc.code
            return 0

        assert await asyncio.to_thread(publish, "secret.kombu") == 403
        assert await asyncio.to_thread(bind, "secret.#") == 403
        assert await asyncio.to_thread(publish, "public.kombu") == 0
        assert await asyncio.to_thread(bind, "public.#") == 0
        got = await sub.receive(1)
        assert [(m.topic, m.payload) for m in got] == [("public/kombu", b"via kombu")]
        await sub.nothing_more()
        await sub.disconnect()


# -- AMQP's own permissions ----------------------------------------------------------------------
async def test_amqp_permissions_per_resource(data_dir: Path, secured: dict) -> None:
    async with running_gateway(data_dir, **secured) as gw:
        def run() -> list[int]:
            alice = pika_connection(gw, "alice")  # ".*" ".*" ".*": every AMQP resource
            alice.channel().queue_declare("alice.q")
            conn = pika_connection(gw, "carol")
            codes = []
            for call in (
                lambda ch: ch.queue_declare("other.q"),  # configure
                lambda ch: ch.queue_declare("carol.q"),
                lambda ch: ch.basic_get("alice.q"),  # read
                lambda ch: ch.queue_purge("alice.q"),  # read
                lambda ch: ch.queue_delete("alice.q"),  # configure
                lambda ch: ch.basic_publish("", "carol.q", b"x"),  # write on amq.default
                lambda ch: ch.queue_bind("carol.q", "amq.topic", "public.#"),
                lambda ch: ch.queue_bind("carol.q", "amq.topic", "private.#"),  # no read right on the topics
                lambda ch: ch.exchange_declare("x.ex", "fanout"),
                lambda ch: ch.basic_get("carol.q"),
            ):
                ch = conn.channel()
                ch.confirm_delivery()
                codes.append(refused(lambda call=call, ch=ch: call(ch)))
            conn.close()
            alice.close()
            return codes

        assert await asyncio.to_thread(run) == [403, 0, 403, 403, 403, 403, 0, 403, 403, 0]
        assert gw.authorizer.stats.denied[("amqp", "amqp configure")] == 3


async def test_amqp_permissions_need_granting_and_refusals_name_the_resource(data_dir: Path, secured: dict) -> None:
    """As RabbitMQ: a user without an amqp line has no access to the vhost (connection.open
    refused); direct reply-to's pseudo-queue is anyone's to consume; queue.declare with a dead-letter exchange needs read on the queue too; an empty
    regex grants nothing; a refusal's text names the resource as RabbitMQ's does."""
    async with running_gateway(data_dir, **secured) as gw:
        def run() -> list[tuple[int, str]]:
            texts = []
            for call in (
                lambda ch: ch.queue_declare("dan.q"),
                # direct reply-to's pseudo-queue needs no read permission (RabbitMQ's rule)
                lambda ch: ch.basic_consume("amq.rabbitmq.reply-to", lambda *a: None, auto_ack=True),
                lambda ch: ch.queue_declare("dan.dl", arguments={"x-dead-letter-exchange": "dan.x"}),
                lambda ch: ch.basic_get("dan.q"),
                lambda ch: ch.basic_publish("", "dan.q", b"x"),
            ):
                conn = pika_connection(gw, "dan")
                ch = conn.channel()
                ch.confirm_delivery()
                texts.append(closed_with(lambda call=call, ch=ch: call(ch)))
                conn.close()
            conn = pika_connection(gw, "mallory")
            ch = conn.channel()
            ch.confirm_delivery()
            texts.append(closed_with(lambda: ch.basic_publish("amq.topic", "secret.amqp", b"leak")))
            conn.close()
            try:
                pika_connection(gw, "erin")
            except pika.exceptions.ProbableAccessDeniedError as exc:  # (pika's name for a refused open)
                texts.append((530, str(exc)))
            return texts

        assert await asyncio.to_thread(run) == [
            (0, ""),
            (0, ""),
            (403, "ACCESS_REFUSED - access to queue 'dan.dl' in vhost '/' refused for user 'dan'"),
            (403, "ACCESS_REFUSED - access to queue 'dan.q' in vhost '/' refused for user 'dan'"),
            (403, "ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user 'dan'"),
            (403, "ACCESS_REFUSED - access to topic 'secret.amqp' in exchange 'amq.topic' in vhost '/' "
                  "refused for user 'mallory'"),
            (530, 'ConnectionClosedByBroker: (530) "NOT_ALLOWED - access to vhost \'/\' refused for user \'erin\'"'),
        ]


async def test_refusals_counted_and_logged_once_per_interval(data_dir: Path, secured: dict,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tidemq.auth")
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", **secured) as gw:
        mallory = PahoClient(mqtt_port(gw), "m1", username="mallory", password="pw-mallory")
        await mallory.connect()
        for i in range(30):
            await mallory.publish("secret/x", f"{i}".encode(), 1)  # each answered 0x87 (3.1.1: acked, dropped)
        await mallory.disconnect()
        lines = [r.getMessage() for r in caplog.records if r.name == "tidemq.auth"]
        assert len(lines) == 1 and "protocol=mqtt user=mallory" in lines[0] and "action=publish" in lines[0]
        import aiohttp

        url = f"http://127.0.0.1:{gw.metrics_address[1]}/metrics"
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            text = await response.text()
        assert 'tidemq_authorization_denied_total{action="publish",protocol="mqtt"} 30.0' in text


async def test_pika_dead_letter_routes_into_and_out_of_denied_topics_refused(data_dir: Path, secured: dict) -> None:
    """Dead-lettering is a route like a binding: mallory may not declare a queue whose dead
    letters reach amq.topic through an exchange bound into it, publish where a queue dead-letters
    her routing key on into it, nor read (bind to, consume) where alice's queue of secret/#
    dead-letters to."""
    async with running_gateway(data_dir, **secured) as gw:
        def run() -> list[int]:
            alice = pika_connection(gw, "alice").channel()
            alice.exchange_declare("alice.in", "fanout")
            alice.exchange_bind("amq.topic", "alice.in", "")
            alice.exchange_declare("alice.direct", "direct")  # its queue dead-letters with the key it came with
            alice.queue_declare("alice.dl", arguments={"x-dead-letter-exchange": "amq.topic"})
            alice.queue_bind("alice.dl", "alice.direct", "secret.x")
            alice.queue_bind("alice.dl", "alice.direct", "public.x")
            alice.exchange_declare("alice.dlx", "fanout")  # where alice's queue of secret/# dead-letters to
            alice.queue_declare("alice.secret", arguments={"x-dead-letter-exchange": "alice.dlx"})
            alice.queue_bind("alice.secret", "amq.topic", "secret.#")
            alice.queue_declare("alice.dead")
            alice.queue_bind("alice.dead", "alice.dlx", "")
            conn = pika_connection(gw, "mallory")
            codes = []
            for call in (
                lambda ch: ch.queue_declare("mq.dl", arguments={  # alice.in feeds amq.topic
                    "x-dead-letter-exchange": "alice.in", "x-dead-letter-routing-key": "secret.leak"}),
                lambda ch: ch.queue_declare("mq.dl2", arguments={"x-dead-letter-exchange": "alice.in"}),
                lambda ch: ch.basic_publish("alice.direct", "secret.x", b"leak"),  # dead-lettered as secret/x
                lambda ch: (ch.queue_declare("mq.dead"), ch.queue_bind("mq.dead", "alice.dlx", "")),
                lambda ch: ch.basic_get("alice.dead"),
                lambda ch: ch.queue_declare("mq.dl3", arguments={
                    "x-dead-letter-exchange": "alice.in", "x-dead-letter-routing-key": "public.dead"}),
                lambda ch: ch.basic_publish("alice.direct", "public.x", b"fine"),
            ):
                ch = conn.channel()
                ch.confirm_delivery()
                codes.append(refused(lambda call=call, ch=ch: call(ch)))
            conn.close()
            return codes

        assert await asyncio.to_thread(run) == [403, 403, 403, 403, 403, 0, 0]
