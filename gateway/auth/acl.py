"""Access control lists in Mosquitto's ``acl_file`` format:

    # comment
    topic [read|write|readwrite|deny] <topic filter>    (before any "user" line: anonymous clients)
    user <username>                                       (the topic lines below are that user's)
    pattern [read|write|readwrite|deny] <topic filter>   (every client; %u = user name, %c = client id)
    amqp <configure regex> <write regex> <read regex>     (TideMQ's own: AMQP permissions, below)

Access defaults to readwrite. A matching ``deny`` rule wins over any allow; without a matching
allow rule access is denied. Subscribing to a filter needs a read rule that covers the whole
filter (rule ``a/#`` allows subscribing ``a/+/b``; rule ``a/b`` does not allow ``a/#``), and
when the client's rules deny some reads (or a resumed session holds a subscription no rule
covers any more), every delivered message is checked too.

The topic rules are the rights of every protocol on MQTT topic space (gateway/auth/authorize.py
says where each protocol crosses into it). Principals without an MQTT client id (AMQP users,
remoting AccessKeys, HTTP users) get no ``%c`` patterns.

``amqp`` lines give a user (or, before any ``user`` line, anonymous clients) RabbitMQ's three
permission regexes (``rabbitmqctl set_permissions``) on AMQP exchanges and queues of the one
vhost ``/``. As RabbitMQ, a regex matches anywhere in the name unless anchored (``^...$``), and
the default exchange is named ``amq.default``; an empty regex grants nothing (RabbitMQ's ``^$``).
As RabbitMQ, a principal without an ``amqp`` line has no permissions on the vhost. Regexes with
spaces are written in double quotes.
"""

from __future__ import annotations

import enum
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from protocols.mqtt.topics import (
    TopicError,
    covers,
    matches,
    overlaps,
    validate_topic_filter,
)


class AclError(ValueError):
    """An ACL file that cannot be used; the message names file and line."""


class Access(enum.Flag):
    READ = 1  # subscribe / receive
    WRITE = 2  # publish
    DENY = 4


_ACCESS = {"read": Access.READ, "write": Access.WRITE, "readwrite": Access.READ | Access.WRITE,
           "deny": Access.DENY}


@dataclass(frozen=True, slots=True)
class Rule:
    access: Access
    topic: str
    pattern: bool = False  # %u / %c substituted per client

    def topic_for(self, username: str | None, client_id: str | None) -> str | None:
        if not self.pattern:
            return self.topic
        if "%u" in self.topic and username is None:
            return None  # a %u pattern never applies to anonymous clients
        if "%c" in self.topic and client_id is None:
            return None  # nor a %c pattern to a principal without an MQTT client id
        if any(c in value for value in (username or "", client_id or "") for c in "+#"):
            return None  # a wildcard in a name would widen the rule to others' topics (as Mosquitto)
        return self.topic.replace("%u", username or "").replace("%c", client_id or "")


AMQP_PERMISSIONS = ("configure", "write", "read")


@dataclass(frozen=True, slots=True)
class AmqpPermissions:
    """RabbitMQ's configure / write / read regexes of one principal."""

    configure: re.Pattern[str]
    write: re.Pattern[str]
    read: re.Pattern[str]

    def allows(self, permission: str, name: str) -> bool:
        return getattr(self, permission).search(name) is not None


AMQP_EVERYTHING = AmqpPermissions(*(re.compile(".*") for _ in AMQP_PERMISSIONS))


@dataclass(slots=True)
class Acl:
    anonymous: list[Rule] = field(default_factory=list)
    users: dict[str, list[Rule]] = field(default_factory=dict)
    patterns: list[Rule] = field(default_factory=list)
    amqp: dict[str | None, AmqpPermissions] = field(default_factory=dict)  # user (None: anonymous) -> rights
    allow_everything: bool = False

    @classmethod
    def allow_all(cls) -> Acl:
        return cls(allow_everything=True)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Acl:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise AclError(f"cannot read ACL file {path}: {exc.strerror}") from None
        acl = cls()
        current = acl.anonymous
        current_user: str | None = None
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            keyword, _, rest = line.partition(" ")
            rest = rest.strip()
            try:
                if keyword == "user":
                    if not rest:
                        raise ValueError("user needs a name")
                    current = acl.users.setdefault(rest, [])
                    current_user = rest
                elif keyword in ("topic", "pattern"):
                    rule = _parse_rule(rest, keyword == "pattern")
                    (acl.patterns if rule.pattern else current).append(rule)
                elif keyword == "amqp":
                    if current_user in acl.amqp:
                        raise ValueError("a second amqp line for the same user")
                    acl.amqp[current_user] = _parse_amqp(rest)
                else:
                    raise ValueError(f"unknown keyword {keyword!r} (topic, user, pattern or amqp)")
            except (ValueError, TopicError) as exc:
                raise AclError(f"{path}:{number}: {exc}") from None
        return acl

    def _rules(self, username: str | None, client_id: str | None) -> list[tuple[Access, str]]:
        own = self.users.get(username, []) if username is not None else self.anonymous
        found = [(r.access, r.topic) for r in own]
        for rule in self.patterns:
            topic = rule.topic_for(username, client_id)
            if topic is not None:
                found.append((rule.access, topic))
        return found

    def _allows(self, username: str | None, client_id: str | None, access: Access, test) -> bool:
        if self.allow_everything:
            return True
        allowed = False
        for rule_access, rule_topic in self._rules(username, client_id):
            if rule_access is Access.DENY:
                if test(rule_topic, deny=True):
                    return False
            # (mypy narrows a Flag to its other members here, and then refuses ``in``)
            elif access in rule_access and test(rule_topic, deny=False):  # type: ignore[operator]
                allowed = True
        return allowed

    def allows_publish(self, username: str | None, client_id: str | None, topic: str) -> bool:
        return self._allows(username, client_id, Access.WRITE, lambda rule, deny: matches(rule, topic))

    def allows_read(self, username: str | None, client_id: str | None, topic: str) -> bool:
        """Whether a message on ``topic`` may be delivered to this client."""
        return self._allows(username, client_id, Access.READ, lambda rule, deny: matches(rule, topic))

    def allows_subscribe(self, username: str | None, client_id: str | None, topic_filter: str) -> bool:
        # allowed: a read rule covers the whole filter; refused: a deny rule covers all of it
        return self._allows(username, client_id, Access.READ, lambda rule, deny: covers(rule, topic_filter))

    def allows_every(self, username: str | None, client_id: str | None, access: Access, topic_filter: str) -> bool:
        """Whether every topic the filter matches may be read (or written): an allow rule covers
        the whole filter and no deny rule touches any of it. For readers that cannot have single
        messages checked (an AMQP queue bound to amq.topic is shared and kept) and writers whose
        topics are not known yet (an exchange bound to amq.topic)."""
        return self._allows(username, client_id, access,
                            lambda rule, deny: overlaps(rule, topic_filter) if deny else covers(rule, topic_filter))

    def allows_some(self, username: str | None, client_id: str | None, access: Access, topic_filter: str) -> bool:
        """Whether an allow rule reaches some topic of the filter and no deny rule covers all of
        it (single messages are then checked)."""
        return self._allows(username, client_id, access,
                            lambda rule, deny: covers(rule, topic_filter) if deny else overlaps(rule, topic_filter))

    def amqp_permissions(self, username: str | None) -> AmqpPermissions | None:
        """The user's AMQP permissions; None: no ``amqp`` line, no access to the vhost."""
        if self.allow_everything:
            return AMQP_EVERYTHING
        return self.amqp.get(username)

    def checks_deliveries(self, username: str | None, client_id: str | None) -> bool:
        """True when some deny rule could refuse single messages of an allowed subscription."""
        if self.allow_everything:
            return False
        return any(access is Access.DENY for access, _ in self._rules(username, client_id))


def _parse_amqp(text: str) -> AmqpPermissions:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"amqp: {exc}") from None
    if len(words) != 3:
        raise ValueError("amqp needs three regexes: configure, write, read (as rabbitmqctl set_permissions)")
    try:  # (as RabbitMQ, "" is "^$": it matches no name)
        return AmqpPermissions(*(re.compile(word or "^$") for word in words))
    except re.error as exc:
        raise ValueError(f"amqp: bad regex: {exc}") from None


def _parse_rule(text: str, pattern: bool) -> Rule:
    word, _, topic = text.partition(" ")
    access = _ACCESS.get(word)
    if access is None:
        access, topic = Access.READ | Access.WRITE, text  # no access word: readwrite
    topic = topic.strip()
    if not topic:
        raise ValueError("a rule needs a topic")
    validate_topic_filter(topic)
    return Rule(access, topic, pattern)
