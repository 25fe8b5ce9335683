"""Who a remoting request comes from, and what it may do (gateway/auth/authorize.py).

When the gateway has a password file or an ACL, every request is authenticated as RocketMQ's
ACL plugin does it: signed with an AccessKey's SecretKey (gateway/auth/access_keys.py); an
unsigned request is an anonymous client's, refused unless ``allow_anonymous``. The store
link's requests (gateway nodes) are not signed: they have the cluster token instead.

A remoting topic ``T`` is the MQTT first level ``T`` (topics.py), so the ACL's topic rights
apply: a send writes ``T`` (or ``T`` + its ``mqttSecondTopic``); a pull of ``T`` reads the
MQTT topics under it, each message checked unless every one may be read; a message looked up
by id or key, or given back for a retry, must be one the principal could have pulled. Retry
and dead-letter topics (``%...``) are not MQTT topics, but their messages are checked by the
topic they were first on (``rmq.ot``). Refusals answer NO_PERMISSION (16), as RocketMQ's
broker does.

(Timer messages and transactions' half messages are held by the store: timers.py,
transactions.py.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from protocols.mqtt.topics import TopicError, validate_topic_name
from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import RemotingCommand, response_to
from store import StoredMessage

from ..auth.access_keys import ACCESS_KEY, AccessKeys
from ..auth.authorize import Authorizer, Principal
from ..interop import REMOTING_QUEUE_PREFIX, SECOND_TOPIC_PROPERTY, mqtt_topic_of
from .messages import origin_topic
from .requests import BadRequest, Client

if TYPE_CHECKING:
    from ..stats import ProtocolStats

ANONYMOUS = Principal("remoting", None)


class RemotingAccess:
    def __init__(self, authorizer: Authorizer | None = None, keys: AccessKeys | None = None, *,
                 required: bool = False, allow_anonymous: bool = True, stats: ProtocolStats | None = None) -> None:
        self.authorizer = authorizer or Authorizer(None)
        self.keys = keys
        self.required = required  # a password file or an ACL: requests are authenticated
        self.allow_anonymous = allow_anonymous
        self.stats = stats
        self.unsigned_codes: set[int] = set()  # the store link's (its own cluster token)

    # -- authentication ------------------------------------------------------------------------
    def authenticate(self, conn: Client, request: RemotingCommand) -> RemotingCommand | None:
        """Set ``conn.principal`` for this request; or the NO_PERMISSION response refusing it."""
        if not self.required or request.code in self.unsigned_codes:
            conn.principal = ANONYMOUS
            return None
        ext = request.ext_fields
        if ACCESS_KEY not in ext:
            if self.allow_anonymous:
                conn.principal = Principal("remoting", None, None, conn.peer)
                return None
            why = "this gateway needs signed requests: set an AccessKey and SecretKey (RocketMQ ACL)"
        elif self.keys is None:
            why = "this gateway has no access keys file: no AccessKey is known"
        else:
            user, why = self.keys.verify(ext, request.body)
            if user is not None:
                conn.principal = Principal("remoting", user, None, conn.peer)
                return None
        if self.stats is not None:
            self.stats.auth_failures += 1
        who = Principal("remoting", ext.get(ACCESS_KEY), None, conn.peer)
        self.authorizer.denied(who, "authenticate", f"request code {request.code}")
        return response_to(request, ResponseCode.NO_PERMISSION, why)

    # -- sends ---------------------------------------------------------------------------------
    def check_send(self, who: Principal, topic: str, properties: dict[str, str]) -> None:
        """Raise BadRequest when this message may not be sent (as it is) to ``topic``."""
        mqtt_topic = mqtt_topic_of(topic, properties.get(SECOND_TOPIC_PROPERTY))
        if mqtt_topic is None:
            return
        try:
            validate_topic_name(mqtt_topic)  # (MQTT subscribers must never get a wildcard topic)
        except TopicError as exc:
            raise BadRequest(f"{SECOND_TOPIC_PROPERTY} makes no MQTT topic name: {exc}",
                             ResponseCode.MESSAGE_ILLEGAL) from None
        if not self.authorizer.can_write(who, mqtt_topic):
            raise BadRequest(self.authorizer.denied(who, "send", mqtt_topic), ResponseCode.NO_PERMISSION)

    # -- reads ---------------------------------------------------------------------------------
    def read_filter(self, who: Principal, topic: str) -> Callable[[StoredMessage], bool] | None:
        """For a pull of ``topic``: None (every message may be read), or the test of each
        message; BadRequest when none of its MQTT topics may be read."""
        authorizer = self.authorizer
        if not authorizer.enabled:
            return None
        if mqtt_topic_of(topic, None) is not None:
            every = f"{topic}/#"  # (matches ``topic`` itself too)
            if authorizer.can_read_all(who, every):
                return None
            if not authorizer.can_read_some(who, every):
                raise BadRequest(authorizer.denied(who, "pull", topic), ResponseCode.NO_PERMISSION)
        # (a retry or dead-letter topic holds messages of other topics: each by its first topic)
        return lambda message: self._may_read_topic(who, origin_topic(message))

    def _may_read_topic(self, who: Principal, topic: str) -> bool:
        return topic.startswith("%") or self.authorizer.can_read(who, topic)

    def may_read(self, who: Principal, message: StoredMessage) -> bool:
        """A message asked for by id or key, or given back: one this principal could pull."""
        if not self.authorizer.enabled:
            return True
        if not any(queue.startswith(REMOTING_QUEUE_PREFIX) for queue, _ in message.queues):
            return False  # not in a remoting topic: no remoting reader may see it
        return self._may_read_topic(who, origin_topic(message))

    def check_read(self, who: Principal, message: StoredMessage, action: str) -> None:
        if not self.may_read(who, message):
            raise BadRequest(self.authorizer.denied(who, action, message.topic), ResponseCode.NO_PERMISSION)
