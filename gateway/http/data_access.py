"""Who a ``/data/`` request comes from, and which store queues it may read or topics publish to
(gateway/auth/authorize.py; the API itself: data_api.py, data_publish.py).

    Authorization: Bearer <admin_token>     the operator: every queue and topic
    Authorization: Basic <user:password>    a user of the password file: under the ACL, or
                                            the operator if ``admin_users`` names it
    (nothing)                               the operator while no credentials are required
                                            (no admin_token, no authentication configured);
                                            else refused (401)

A queue is read as what it holds: ``t:{topic}`` that MQTT topic, ``w:{filter}`` every topic of
the filter (a reader of a queue cannot have single rows checked, so a deny rule touching the
filter refuses it), ``q:{name}`` the AMQP queue (AMQP read permission, and read on the topics
amq.topic feeds it with), ``r:{topic}:{id}``
every MQTT topic under the remoting topic; other queues (retry, schedule, internal) are the
operator's. Refusals answer 403 and are counted and logged as every protocol's.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import TYPE_CHECKING

from aiohttp import web

from ..amqp.permissions import queue_topics_readable
from ..auth.authorize import Principal
from .errors import AdminError

if TYPE_CHECKING:
    from ..amqp.broker import AMQPBroker
    from .deps import HttpAccess

PRINCIPAL = web.RequestKey("tidemq.principal", object)  # the request's: a Principal, or None (the operator)


class DataAccess:
    """The checks of ``/data/`` requests, from the listener's access settings and (for the
    topics an AMQP queue is fed with) the AMQP gateway."""

    def __init__(self, access: HttpAccess, amqp: AMQPBroker | None) -> None:
        self.access = access
        self.authorizer = access.authorizer
        self.amqp = amqp

    async def authenticate(self, request: web.Request) -> Principal | None:
        """The request's principal (None: the operator); AdminError 401 when credentials are
        required and missing, or refused."""
        header = request.headers.get("Authorization", "")
        access = self.access
        token = access.admin_token
        if header.startswith("Bearer ") and token:
            if hmac.compare_digest(header.encode(), f"Bearer {token}".encode()):
                return None
            raise AdminError(401, "a valid admin token is needed")
        if header.startswith("Basic "):
            try:
                user, sep, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise AdminError(401, "malformed Basic credentials") from None
            passwords = access.passwords
            if not sep or passwords is None or not await passwords.verify_async(user, password):
                raise AdminError(401, "user name or password refused")
            return None if user in access.admin_users else Principal("http", user, None, request.remote or "")
        if access.requires_credentials:
            raise AdminError(401, "credentials are needed: the admin token (Bearer) or a user's Basic credentials")
        return None  # nothing configured: every caller may do everything, as every client

    def may_read_queue(self, who: Principal | None, queue: str) -> bool:
        authorizer = self.authorizer
        if who is None or not authorizer.enabled:
            return True
        kind, _, name = queue.partition(":")
        if kind == "t":
            return authorizer.can_read(who, name)
        if kind == "w":
            return authorizer.can_read_all(who, name)
        if kind == "q":
            amqp = self.amqp
            return authorizer.amqp_allows(who, "read", name) and (amqp is None or queue_topics_readable(amqp, who, name))
        if kind == "r":
            topic = name.rpartition(":")[0]
            return not topic.startswith("%") and authorizer.can_read_all(who, f"{topic}/#")
        return False

    def check_read_queue(self, who: Principal | None, queue: str) -> None:
        if not self.may_read_queue(who, queue):
            assert who is not None
            raise AdminError(403, self.authorizer.denied(who, "read", queue))

    def check_publish(self, who: Principal | None, topics: set[str]) -> None:
        """403 when one of the topics may not be written (then nothing of the request is stored)."""
        authorizer = self.authorizer
        if who is None or not authorizer.enabled:
            return
        for topic in sorted(topics):
            if not authorizer.can_write(who, topic):
                raise AdminError(403, authorizer.denied(who, "publish", topic) + ": nothing of this request was stored")
