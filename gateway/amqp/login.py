"""Who an AMQP connection is: the login of connection.start-ok (PLAIN or AMQPLAIN, checked
against the gateway's password file) and connection.update-secret, which checks the new secret
as the user's password while the connection stays open (403 and a connection close if wrong)."""

from __future__ import annotations

import logging
from typing import Protocol

from pamqp import commands

from protocols.amqp.frames import ACCESS_REFUSED, AMQPError, connection_error, method_frame
from protocols.amqp.login import parse_login, secret_bytes

from ..read_pauses import ReadPauses
from .broker import AMQPBroker


class LoggingIn(Protocol):
    """The connection being logged in (``connection.AMQPConnection`` is one)."""

    broker: AMQPBroker
    username: str | None
    peer: str
    closed: bool
    stage: str
    channel_max: int
    frame_max: int
    read_pauses: ReadPauses

    def send(self, data: bytes) -> None: ...

    def flush(self) -> None: ...

    def close_transport(self) -> None: ...

    def fail_channel(self, exc: AMQPError) -> None: ...

log = logging.getLogger("tidemq.amqp")


async def _verify(conn: LoggingIn, password: bytes) -> bool:
    auth = conn.broker.authenticator
    if auth is None:
        return conn.broker.allow_anonymous
    return await auth.verify_async(conn.username, password)  # type: ignore[attr-defined]


async def authenticate(conn: LoggingIn, method: commands.Connection.StartOk) -> None:
    """Check start-ok's credentials; tune on success, close (403) otherwise."""
    ok = False
    try:
        login = parse_login(method.mechanism, method.response)
        if login is not None:
            conn.username, password = login
            ok = await _verify(conn, password)
    except Exception:
        log.exception("authentication failed with an error peer=%s", conn.peer)
    if conn.closed:
        return
    if not ok:
        log.info("amqp login refused peer=%s user=%s mechanism=%s", conn.peer, conn.username, method.mechanism)
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


async def update_secret(conn: LoggingIn, method: commands.Connection.UpdateSecret) -> None:
    """connection.update-secret: update-secret-ok if the new secret is the user's password
    now, else connection.close 403 (as RabbitMQ when its backend refuses the new secret)."""
    ok = False
    try:
        ok = await _verify(conn, secret_bytes(method.new_secret))
    except Exception:
        log.exception("secret check failed with an error peer=%s", conn.peer)
    if conn.closed or conn.stage != "open-done":
        return
    if ok:
        log.info("amqp secret updated peer=%s user=%s reason=%r", conn.peer, conn.username, method.reason)
        conn.send(method_frame(0, commands.Connection.UpdateSecretOk()))
        conn.flush()
    else:
        conn.broker.stats.auth_failures += 1
        conn.fail_channel(connection_error(ACCESS_REFUSED, f"new secret refused for user '{conn.username}'", 0,
                                           method))
    conn.read_pauses.resume("auth")
