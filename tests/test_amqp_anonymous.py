"""AMQP's anonymous login, as RabbitMQ's: ``guest``/``guest`` (what AMQP clients send when the
application gives no credentials) and SASL ANONYMOUS are the ACL's anonymous principal when
``guest`` is not a user of the password file and anonymous clients are allowed; otherwise the
login is refused (connection.close 403). A ``guest`` line in the password file is a real user."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aio_pika
import pika
import pytest
from pamqp import commands

from gateway.auth import PasswordFile
from protocols.amqp.frames import PROTOCOL_HEADER, method_frame

from .amqp_support import RawAMQP
from .mqtt_support import PahoClient, mqtt_port, running_gateway

# anonymous clients: public/# only; AMQP: publish to amq.topic, their own anon.* queues
ACL = r"""
topic readwrite public/#
amqp "^anon\." "^amq\.topic$|^anon\." "^anon\.|^amq\.topic$"

user alice
topic readwrite #
amqp ".*" ".*" ".*"

user guest
topic readwrite guest/#
amqp ".*" ".*" ".*"
"""

ACL_WITHOUT_ANONYMOUS_AMQP = """
topic readwrite public/#

user alice
topic readwrite #
amqp ".*" ".*" ".*"
"""


def amqp_port(gw) -> int:
    return next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")


def config(tmp_path: Path, *, users: dict[str, str] | None, allow_anonymous: bool = True, acl: str = ACL) -> dict:
    (tmp_path / "acl").write_text(acl)
    settings = {"acl_file": str(tmp_path / "acl"), "allow_anonymous": allow_anonymous, "amqp_bind": "127.0.0.1:0"}
    if users is not None:
        passwords = PasswordFile()
        for name, password in users.items():
            passwords.set(name, password, iterations=1000)
        passwords.save(tmp_path / "passwd")
        settings["password_file"] = str(tmp_path / "passwd")
    return settings


async def watcher(gw) -> PahoClient:
    client = PahoClient(mqtt_port(gw), "watcher", username="alice", password="pw-alice")
    await client.connect()
    await client.subscribe("#", 1)
    return client


async def publish_as(gw, user: str, password: str, routing_keys: list[str]) -> list[int]:
    """Publish (confirmed) to amq.topic under each key, one channel each: 0 or the close code."""
    conn = await aio_pika.connect(f"amqp://{user}:{password}@127.0.0.1:{amqp_port(gw)}/")
    codes = []
    try:
        for key in routing_keys:
            channel = await conn.channel(publisher_confirms=True)
            exchange = await channel.get_exchange("amq.topic", ensure=False)
            try:
                await exchange.publish(aio_pika.Message(b"from " + user.encode()), key)
                codes.append(0)
            except aio_pika.exceptions.ChannelClosed as exc:
                codes.append(403 if "ACCESS_REFUSED" in str(exc) else -1)
            finally:
                if not channel.is_closed:
                    await channel.close()
    finally:
        await conn.close()
    return codes


def login_refusal(gw, user: str, password: str) -> str:
    """"" when pika's login (and connection.open) succeeds, else what refused it."""
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", amqp_port(gw), credentials=pika.PlainCredentials(user, password)))
    except pika.exceptions.ProbableAuthenticationError as exc:
        return f"login: {exc}"
    except pika.exceptions.ProbableAccessDeniedError as exc:
        return f"open: {exc}"
    conn.close()
    return ""


@pytest.mark.parametrize("with_password_file", [False, True])
async def test_guest_guest_is_the_acl_anonymous_principal(data_dir: Path, tmp_path: Path,
                                                          with_password_file: bool) -> None:
    """guest/guest gets the rules before any ``user`` line (public/# only), with or without a
    password file, when ``guest`` is not a user there."""
    users = {"alice": "pw-alice"} if with_password_file else None
    async with running_gateway(data_dir, **config(tmp_path, users=users)) as gw:
        mqtt = await watcher(gw)
        try:
            codes = await publish_as(gw, "guest", "guest", ["public.news", "secret.plans", "guest.own"])
            assert codes == [0, 403, 403]
            got = await mqtt.receive(1)
            assert [(m.topic, m.payload) for m in got] == [("public/news", b"from guest")]
            await mqtt.nothing_more()
        finally:
            await mqtt.disconnect()
        assert gw.store.max_offset_now("t:secret/plans") == 0
        assert gw.authorizer.stats.denied[("amqp", "publish")] == 2


@pytest.mark.parametrize("with_password_file", [False, True])
async def test_guest_refused_when_anonymous_clients_are_not_allowed(data_dir: Path, tmp_path: Path,
                                                                    with_password_file: bool) -> None:
    users = {"alice": "pw-alice"} if with_password_file else None
    async with running_gateway(data_dir, **config(tmp_path, users=users, allow_anonymous=False)) as gw:
        refusal = await asyncio.to_thread(login_refusal, gw, "guest", "guest")
        assert refusal.startswith("login: ") and "403" in refusal and "ACCESS_REFUSED" in refusal
        if with_password_file:
            assert await asyncio.to_thread(login_refusal, gw, "alice", "pw-alice") == ""
        assert gw.amqp.stats.auth_failures == 1


async def test_guest_with_another_password_is_refused(data_dir: Path, tmp_path: Path) -> None:
    """Only guest/guest is the anonymous login; other credentials are checked as a user's."""
    async with running_gateway(data_dir, **config(tmp_path, users={"alice": "pw-alice"})) as gw:
        for user, password in (("guest", "not-guest"), ("alice", "wrong"), ("nobody", "guest")):
            refusal = await asyncio.to_thread(login_refusal, gw, user, password)
            assert refusal.startswith("login: ") and "ACCESS_REFUSED" in refusal, (user, refusal)


async def test_a_guest_user_of_the_password_file_is_a_real_user(data_dir: Path, tmp_path: Path) -> None:
    users = {"alice": "pw-alice", "guest": "pw-guest"}
    async with running_gateway(data_dir, **config(tmp_path, users=users)) as gw:
        mqtt = await watcher(gw)
        try:
            # its own section (guest/#), not the anonymous one (public/#)
            assert await publish_as(gw, "guest", "pw-guest", ["guest.own", "public.news"]) == [0, 403]
            got = await mqtt.receive(1)
            assert [(m.topic, m.payload) for m in got] == [("guest/own", b"from guest")]
            await mqtt.nothing_more()
        finally:
            await mqtt.disconnect()
        # its password is checked: guest/guest is no anonymous login then
        refusal = await asyncio.to_thread(login_refusal, gw, "guest", "guest")
        assert refusal.startswith("login: ") and "ACCESS_REFUSED" in refusal


async def test_anonymous_without_an_amqp_line_may_not_open_the_vhost(data_dir: Path, tmp_path: Path) -> None:
    """As RabbitMQ: under an ACL, a principal without AMQP permissions gets 530 on connection.open."""
    settings = config(tmp_path, users=None, acl=ACL_WITHOUT_ANONYMOUS_AMQP)
    async with running_gateway(data_dir, **settings) as gw:
        refusal = await asyncio.to_thread(login_refusal, gw, "guest", "guest")
        assert refusal == ("open: ConnectionClosedByBroker: (530) \"NOT_ALLOWED - access to vhost '/' "
                           "refused for user 'guest'\"")


async def _start(port: int) -> tuple[RawAMQP, commands.Connection.Start]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    raw = RawAMQP(reader, writer)
    writer.write(PROTOCOL_HEADER)
    frames = await raw.until(commands.Connection.Start)
    return raw, frames[-1]


@pytest.mark.parametrize("allow_anonymous", [True, False])
async def test_sasl_anonymous(data_dir: Path, tmp_path: Path, allow_anonymous: bool) -> None:
    """ANONYMOUS is offered only when anonymous clients are allowed; a login with it is the
    anonymous principal (its amq.topic publish to public/# allowed), else refused with 403."""
    settings = config(tmp_path, users={"alice": "pw-alice"}, allow_anonymous=allow_anonymous)
    async with running_gateway(data_dir, **settings) as gw:
        raw, start = await _start(amqp_port(gw))
        try:
            offered = start.mechanisms.split()
            assert offered[:2] == ["PLAIN", "AMQPLAIN"]
            assert ("ANONYMOUS" in offered) is allow_anonymous
            raw.writer.write(method_frame(0, commands.Connection.StartOk(mechanism="ANONYMOUS", response="")))
            if not allow_anonymous:
                close = (await raw.until(commands.Connection.Close))[-1]
                assert close.reply_code == 403
                assert close.reply_text == "ACCESS_REFUSED - Login was refused using authentication mechanism ANONYMOUS"
                return
            await raw.until(commands.Connection.Tune)
            raw.writer.write(method_frame(0, commands.Connection.TuneOk(2047, 131_072, 0)))
            raw.writer.write(method_frame(0, commands.Connection.Open("/")))
            await raw.until(commands.Connection.OpenOk)
            raw.writer.write(method_frame(1, commands.Channel.Open()))
            await raw.until(commands.Channel.OpenOk)
            raw.writer.write(method_frame(1, commands.Queue.Declare(queue="secret.q")))
            close = (await raw.until(commands.Channel.Close))[-1]
            assert close.reply_code == 403
            assert close.reply_text == ("ACCESS_REFUSED - access to queue 'secret.q' in vhost '/' "
                                        "refused for user 'guest'")
        finally:
            raw.writer.close()


async def test_update_secret_of_an_anonymous_login(data_dir: Path, tmp_path: Path) -> None:
    """An anonymous login's secret is ``guest``: another new secret closes the connection (403)."""
    async with running_gateway(data_dir, **config(tmp_path, users={"alice": "pw-alice"})) as gw:
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{amqp_port(gw)}/")
        try:
            await asyncio.wait_for(conn.update_secret("guest", reason="refresh"), 5)
            closed = asyncio.get_running_loop().create_future()
            conn.close_callbacks.add(lambda _, exc: closed.done() or closed.set_result(exc))
            with pytest.raises(Exception):
                await asyncio.wait_for(conn.update_secret("something else"), 5)
            reason = await asyncio.wait_for(closed, 5)
            assert "new secret refused for user 'guest'" in str(reason)
        finally:
            await conn.close()
