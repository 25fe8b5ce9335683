"""Who an AMQP connection is: the login of connection.start-ok (PLAIN or AMQPLAIN, checked
against the gateway's password file; ANONYMOUS, or ``guest``/``guest`` when ``guest`` is not a
user of the file, is the ACL's anonymous principal, only when anonymous clients are allowed) and
connection.update-secret, which checks the new secret as the login's password while the
connection stays open (403 and a connection close if wrong)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pamqp import commands

from protocols.amqp.frames import ACCESS_REFUSED, connection_error, method_frame
from protocols.amqp.login import parse_login, secret_bytes

from .broker import AMQPBroker

if TYPE_CHECKING:
    from .connection import AMQPConnection


log = logging.getLogger("tidemq.amqp")


GUEST = "guest"  # what AMQP clients log in as when the application gives no credentials


async def _verify(broker: AMQPBroker, username: str | None, password: bytes) -> tuple[bool, str | None]:
    """Whether the login is accepted, and the ACL user it is (None: anonymous). Without a
    password file, other user names are taken as given."""
    auth = broker.authenticator
    if username is None or (username == GUEST and (auth is None or GUEST not in auth)):
        return broker.allow_anonymous and (username is None or password == GUEST.encode()), None
    if auth is None:
        return broker.allow_anonymous, username
    return await auth.verify_async(username, password), username


def login_name(username: str | None) -> str:
    """The user name a client knows its login by (``guest`` when anonymous, as RabbitMQ's)."""
    return username if username is not None else GUEST


async def authenticate(conn: AMQPConnection, method: commands.Connection.StartOk) -> None:
    """Check start-ok's credentials; tune on success, close (403) otherwise."""
    ok = False
    try:
        login = parse_login(method.mechanism, method.response)
        if login is not None:
            ok, conn.username = await _verify(conn.broker, *login)
    except Exception:
        log.exception("authentication failed with an error peer=%s", conn.peer)
    if conn.closed:
        return
    if not ok:
        log.info("amqp login refused peer=%s user=%s mechanism=%s", conn.peer, login_name(conn.username),
                 method.mechanism)
        conn.broker.stats.auth_failures += 1
        text = f"ACCESS_REFUSED - Login was refused using authentication mechanism {method.mechanism}"
        conn.send(method_frame(0, commands.Connection.Close(ACCESS_REFUSED, text[:255], 0, 0)))
        conn.stage = "closing"
        conn.close_transport()
        return
    conn.stage = "tune-ok"
    conn.send(method_frame(0, commands.Connection.Tune(conn.channel_max, conn.frame_max, conn.broker.heartbeat)))
    conn.flush()
    conn.read_pauses.resume("auth")


async def update_secret(conn: AMQPConnection, method: commands.Connection.UpdateSecret) -> None:
    """connection.update-secret: update-secret-ok if the new secret is the login's password
    now (``guest`` for an anonymous login), else connection.close 403 (as RabbitMQ when its
    backend refuses the new secret)."""
    ok = False
    try:
        ok, user = await _verify(conn.broker, login_name(conn.username), secret_bytes(method.new_secret))
        ok = ok and user == conn.username
    except Exception:
        log.exception("secret check failed with an error peer=%s", conn.peer)
    if conn.closed or conn.stage != "open-done":
        return
    if ok:
        log.info("amqp secret updated peer=%s user=%s reason=%r", conn.peer, login_name(conn.username), method.reason)
        conn.send(method_frame(0, commands.Connection.UpdateSecretOk()))
        conn.flush()
    else:
        conn.broker.stats.auth_failures += 1
        text = f"new secret refused for user '{login_name(conn.username)}'"
        conn.fail_channel(connection_error(ACCESS_REFUSED, text, 0, method))
    conn.read_pauses.resume("auth")
