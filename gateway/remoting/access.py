"""Who a remoting request comes from, and what it may do (gateway/auth/authorize.py).

When the gateway has a password file or an ACL, every request is authenticated as RocketMQ's
ACL plugin does it: signed with an AccessKey's SecretKey (gateway/auth/access_keys.py); an
unsigned request is an anonymous client's, refused unless ``allow_anonymous``. The store
link's requests (gateway nodes) are not signed: they have the cluster token instead.

A remoting topic ``T`` is the MQTT first level ``T`` (topics.py), so the ACL's topic rights
apply, and ``REQUEST_NEEDS`` says what each request code needs of them: a send writes ``T``
(or ``T`` + its ``mqttSecondTopic``); whatever reads ``T`` or moves a consumer's place in it
(pulls, pops and acks, consumer offsets, queue locks, a consumer's subscriptions) needs some
read right under it, each message then checked unless every one may be read; a message looked
up by id or key, or given back for a retry, must be one the principal could have pulled; a
transaction is ended, and checked with, only by who may write its message; a topic is created
by whoever may use it, and changed (queues, permission) only by who may write all of it. Retry and
dead-letter topics (``%...``) are not MQTT topics, but their messages are checked by the topic
they were first on (``rmq.ot``). Refusals answer NO_PERMISSION (16), as RocketMQ's broker does.

(Timer messages and transactions' half messages are held by the store: timers.py,
transactions.py.)
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocols.mqtt.topics import TopicError, validate_topic_name
from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.frames import RemotingCommand, response_to
from store import StoredMessage

from ..auth.access_keys import ACCESS_KEY, AccessKeys
from ..auth.authorize import Authorizer, Principal
from ..core.pop import Admission
from ..interop import DLQ_PREFIX, REMOTING_QUEUE_PREFIX, RETRY_PREFIX, SECOND_TOPIC_PROPERTY, mqtt_topic_of
from .messages import origin_topic, resent_from
from .requests import BadRequest

if TYPE_CHECKING:
    from .connection import RemotingConnection
    from ..stats import ProtocolStats

ANONYMOUS = Principal("remoting", None)


class Unauthenticated(Exception):
    """A request whose signature (or its absence) this gateway does not accept; why."""


class Right(enum.Enum):
    """What a request needs on a remoting topic ``T``'s MQTT topics (``T`` and under it)."""

    NONE = "none"  # no topic's messages or consumer places (the ACL has no rights on groups)
    READ = "read"  # some read right under T, each message then checked: what a pull needs
    USE = "use"  # some read or write right under T: a route lookup, which creates T
    WRITE = "write"  # write on each message's MQTT topic
    CONFIGURE = "configure"  # write on every MQTT topic under T: a change of T's queues or permission


@dataclass(frozen=True, slots=True)
class Needs:
    """A request's ``right``, on the topic its ext field ``field`` names, checked before its
    handler runs; with no ``field`` its handler checks it, on the topics of its body or of the
    stored message it names."""

    right: Right
    field: str | None = None


_ON_TOPIC_FIELD = {right: Needs(right, "topic") for right in Right}
_IN_HANDLER = {right: Needs(right) for right in Right}

# Every request code the broker handles (broker.py's handler table), and what it needs.
REQUEST_NEEDS: dict[int, Needs] = {
    # name server role: a lookup creates the topic; the list shows the topics one may use
    RequestCode.GET_ROUTEINFO_BY_TOPIC: _ON_TOPIC_FIELD[Right.USE],
    # (creating T as a lookup would; a change, or other settings: CONFIGURE, in its handler)
    RequestCode.UPDATE_AND_CREATE_TOPIC: _ON_TOPIC_FIELD[Right.USE],
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: _IN_HANDLER[Right.USE],
    RequestCode.GET_BROKER_CLUSTER_INFO: _IN_HANDLER[Right.NONE],
    # sends: each message (check_send); a transaction's end: its half message (check_write)
    RequestCode.SEND_MESSAGE: _IN_HANDLER[Right.WRITE],
    RequestCode.SEND_MESSAGE_V2: _IN_HANDLER[Right.WRITE],
    RequestCode.SEND_BATCH_MESSAGE: _IN_HANDLER[Right.WRITE],
    RequestCode.END_TRANSACTION: _IN_HANDLER[Right.WRITE],
    # reads and consumer places of the topic in the header (each message then read_filter's)
    RequestCode.PULL_MESSAGE: _ON_TOPIC_FIELD[Right.READ],
    RequestCode.POP_MESSAGE: _ON_TOPIC_FIELD[Right.READ],
    RequestCode.ACK_MESSAGE: _ON_TOPIC_FIELD[Right.READ],
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: _ON_TOPIC_FIELD[Right.READ],
    RequestCode.QUERY_CONSUMER_OFFSET: _ON_TOPIC_FIELD[Right.READ],
    RequestCode.UPDATE_CONSUMER_OFFSET: _ON_TOPIC_FIELD[Right.READ],
    RequestCode.GET_MAX_OFFSET: _ON_TOPIC_FIELD[Right.READ],
    RequestCode.GET_MIN_OFFSET: _ON_TOPIC_FIELD[Right.READ],
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: _ON_TOPIC_FIELD[Right.READ],
    RequestCode.GET_EARLIEST_MSG_STORETIME: _ON_TOPIC_FIELD[Right.READ],
    RequestCode.QUERY_MESSAGE: _ON_TOPIC_FIELD[Right.READ],  # (and each message found: may_read)
    # reads of topics in the body (check_topic), or of the stored message named (check_read)
    RequestCode.BATCH_ACK_MESSAGE: _IN_HANDLER[Right.READ],
    RequestCode.LOCK_BATCH_MQ: _IN_HANDLER[Right.READ],
    RequestCode.UNLOCK_BATCH_MQ: _IN_HANDLER[Right.READ],
    RequestCode.HEART_BEAT: _IN_HANDLER[Right.READ],  # a consumer's subscriptions (a producer's: none)
    RequestCode.VIEW_MESSAGE_BY_ID: _IN_HANDLER[Right.READ],
    RequestCode.CONSUMER_SEND_MSG_BACK: _IN_HANDLER[Right.READ],
    # groups and client settings: no topic
    RequestCode.UNREGISTER_CLIENT: _IN_HANDLER[Right.NONE],
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: _IN_HANDLER[Right.NONE],
    RequestCode.CHECK_CLIENT_CONFIG: _IN_HANDLER[Right.NONE],
}


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
    def authenticate(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        """Set ``conn.principal`` for this request; or the NO_PERMISSION response refusing it."""
        if not self.required or request.code in self.unsigned_codes:
            conn.principal = ANONYMOUS
            return None
        ext = request.ext_fields
        try:
            conn.principal = self.identify("remoting", conn.peer, ext.get(ACCESS_KEY),
                                           lambda keys: keys.verify(ext, request.body), f"request code {request.code}")
        except Unauthenticated as exc:
            return response_to(request, ResponseCode.NO_PERMISSION, str(exc))
        return None

    def identify(self, protocol: str, peer: str, access_key: str | None,
                 verify: Callable[[AccessKeys], tuple[str | None, str]], what: str) -> Principal:
        """Who signed a request with ``access_key`` (None: unsigned), checked by ``verify``
        (its protocol's signature) against the access keys; raises Unauthenticated (counted,
        logged) for a bad signature, or an unsigned request where anonymous ones are refused."""
        if not self.required:
            return Principal(protocol, None, None, peer)
        if access_key is None:
            if self.allow_anonymous:
                return Principal(protocol, None, None, peer)
            why = "this gateway needs signed requests: set an AccessKey and SecretKey (RocketMQ ACL)"
        elif self.keys is None:
            why = "this gateway has no access keys file: no AccessKey is known"
        else:
            user, why = verify(self.keys)
            if user is not None:
                return Principal(protocol, user, None, peer)
        if self.stats is not None:
            self.stats.auth_failures += 1
        self.authorizer.denied(Principal(protocol, access_key, None, peer), "authenticate", what)
        raise Unauthenticated(why)

    # -- the request code's needs (REQUEST_NEEDS) ----------------------------------------------
    def check_request(self, who: Principal, request: RemotingCommand) -> None:
        """Raise BadRequest (NO_PERMISSION) when the request's topic field names a topic this
        principal may not use as the request needs; the rest is its handler's to check."""
        if not self.authorizer.enabled or request.code in self.unsigned_codes:
            return
        needs = REQUEST_NEEDS.get(request.code)
        if needs is None:  # (a handler without a rule: refused until it has one)
            raise BadRequest(self.authorizer.denied(who, "request", f"request code {request.code}"),
                             ResponseCode.NO_PERMISSION)
        topic = request.ext_fields.get(needs.field) if needs.field else None
        if topic:  # (a missing one is the handler's bad request)
            self.check_topic(who, topic, needs.right, _action(request.code))

    def may_use(self, who: Principal, topic: str, right: Right) -> bool:
        """Whether ``who`` has ``right`` on remoting topic ``topic`` (READ, USE: some right
        under it; CONFIGURE: write on all of it; a ``%`` topic's messages are checked one by one)."""
        if right is Right.NONE or mqtt_topic_of(topic, None) is None:
            return True
        every = f"{topic}/#"  # (matches ``topic`` itself too)
        authorizer = self.authorizer
        if right is Right.READ:
            return authorizer.can_read_some(who, every)
        if right is Right.USE:
            return authorizer.can_read_some(who, every) or authorizer.can_write_some(who, every)
        if right is Right.CONFIGURE:
            return authorizer.can_write_all(who, every)
        return authorizer.can_write(who, topic)

    def check_topic(self, who: Principal, topic: str, right: Right, action: str) -> None:
        if not self.may_use(who, topic, right):
            raise BadRequest(self.authorizer.denied(who, action, topic), ResponseCode.NO_PERMISSION)

    # -- sends ---------------------------------------------------------------------------------
    def check_send(self, who: Principal, topic: str, properties: dict[str, str]) -> None:
        """Raise BadRequest when this message may not be sent (as it is) to ``topic``: a group's
        retry or dead-letter topic takes only what a send-back would, a message the sender may
        read on the topic it was first on (messages.resent_from)."""
        if topic.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            if self.authorizer.enabled:
                origin = resent_from(topic, properties)
                if origin is None or not self.authorizer.can_read(who, origin):
                    raise BadRequest(self.authorizer.denied(who, "send", origin or topic), ResponseCode.NO_PERMISSION)
            return
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
        """For a pull or pop of ``topic`` (refused before, by REQUEST_NEEDS, when none of its
        MQTT topics may be read): None (every message may be read), or the test of each."""
        if not self.authorizer.enabled:
            return None
        if mqtt_topic_of(topic, None) is not None and self.authorizer.can_read_all(who, f"{topic}/#"):
            return None
        # (a retry or dead-letter topic holds messages of other topics: each by its first topic)
        return lambda message: self._may_read_topic(who, origin_topic(message))

    def pop_admission(self, who: Principal, topic: str, members: Callable[[], Iterable[Principal]]
                      ) -> Callable[[StoredMessage], Admission] | None:
        """For a pop of ``topic`` by ``who``: None (every message is its to take), or what
        becomes of each: taken when ``who`` may read it, else left for another member of the
        group (``members``: who they are) that may, else passed over for the group."""
        mine = self.read_filter(who, topic)
        if mine is None:
            return None

        def admit(message: StoredMessage) -> Admission:
            if mine(message):
                return Admission.TAKE
            for member in members():
                theirs = self.read_filter(member, topic)
                if theirs is None or theirs(message):
                    return Admission.LEAVE
            return Admission.PASS
        return admit

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

    def may_write(self, who: Principal, message: StoredMessage) -> bool:
        """A stored message (a transaction's half message) is one this principal could have sent:
        its record topic is the MQTT topic its send was checked on."""
        return message.topic.startswith("%") or self.authorizer.can_write(who, message.topic)

    def check_write(self, who: Principal, message: StoredMessage, action: str) -> None:
        if not self.may_write(who, message):
            raise BadRequest(self.authorizer.denied(who, action, message.topic), ResponseCode.NO_PERMISSION)


def _action(code: int) -> str:
    """A request code's name as refusals are counted (``update_consumer_offset``)."""
    try:
        return RequestCode(code).name.lower()
    except ValueError:
        return f"request {code}"
