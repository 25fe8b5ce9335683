"""One authorisation model for every protocol: a principal (an MQTT user and client id, an AMQP
user, a remoting AccessKey's user, an HTTP user of the data API) has read and write rights on
MQTT topic space, from the ACL's topic rules, checked wherever a message crosses into or out of
it whatever the protocol; and AMQP's own permissions on AMQP-only exchanges and queues. Each
protocol turns a refusal into its own code (MQTT 0x87, AMQP 403, remoting NO_PERMISSION, HTTP
403); this module counts every refusal and logs them, rate-limited, as key=value lines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from .acl import Access, Acl

log = logging.getLogger("tidemq.auth")

LOG_INTERVAL_S = 10.0  # per principal and action: one line, then a count of the rest per interval
MAX_LOG_KEYS = 10_000  # bounded memory under many principals


@dataclass(frozen=True, slots=True)
class Principal:
    protocol: str  # mqtt, amqp, remoting, http
    username: str | None  # None: anonymous
    client_id: str | None = None  # the MQTT client id (``%c`` patterns); None for other protocols
    peer: str = ""


class AuthorizationStats:
    """Refusals by protocol and action, for ``tidemq_authorization_denied_total``."""

    def __init__(self) -> None:
        self.denied: dict[tuple[str, str], int] = {}


class Authorizer:
    """The ACL applied to principals of any protocol. Without an ACL everything is allowed."""

    def __init__(self, acl: Acl | None) -> None:
        self.acl = acl
        self.stats = AuthorizationStats()
        self._logged: dict[tuple[str, str | None, str], list[float]] = {}  # -> [last logged, suppressed]

    @property
    def enabled(self) -> bool:
        return self.acl is not None and not self.acl.allow_everything

    # -- MQTT topic space ----------------------------------------------------------------------
    def can_write(self, who: Principal, topic: str) -> bool:
        return self.acl is None or self.acl.allows_publish(who.username, who.client_id, topic)

    def can_read(self, who: Principal, topic: str) -> bool:
        """One message on ``topic`` may be handed to this principal."""
        return self.acl is None or self.acl.allows_read(who.username, who.client_id, topic)

    def can_subscribe(self, who: Principal, topic_filter: str) -> bool:
        """A subscription whose messages are then checked one by one (``checks_reads``)."""
        return self.acl is None or self.acl.allows_subscribe(who.username, who.client_id, topic_filter)

    def checks_reads(self, who: Principal, topic_filters: Iterable[str] = ()) -> bool:
        """Single messages must be checked (``can_read``): some deny rule may refuse one of an
        allowed subscription, or one of ``topic_filters`` (subscriptions made under an earlier
        ACL: a resumed session's) is no longer covered by a read rule."""
        acl = self.acl
        if acl is None:
            return False
        return acl.checks_deliveries(who.username, who.client_id) or not all(
            acl.allows_subscribe(who.username, who.client_id, f) for f in topic_filters)

    def can_read_all(self, who: Principal, topic_filter: str) -> bool:
        """Every topic of the filter may be read: for readers whose messages cannot be checked
        one by one (an AMQP queue bound to amq.topic)."""
        return self.acl is None or self.acl.allows_every(who.username, who.client_id, Access.READ, topic_filter)

    def can_read_some(self, who: Principal, topic_filter: str) -> bool:
        """Some topic of the filter may be read (its messages then checked one by one)."""
        return self.acl is None or self.acl.allows_some(who.username, who.client_id, Access.READ, topic_filter)

    def can_write_some(self, who: Principal, topic_filter: str) -> bool:
        """Some topic of the filter may be written."""
        return self.acl is None or self.acl.allows_some(who.username, who.client_id, Access.WRITE, topic_filter)

    def can_write_all(self, who: Principal, topic_filter: str) -> bool:
        """Every topic of the filter may be written: for routes whose topic is not known yet."""
        return self.acl is None or self.acl.allows_every(who.username, who.client_id, Access.WRITE, topic_filter)

    # -- AMQP resources ------------------------------------------------------------------------
    def amqp_allows(self, who: Principal, permission: str, name: str) -> bool:
        """RabbitMQ's configure / write / read permission on exchange or queue ``name``."""
        if self.acl is None:
            return True
        rights = self.acl.amqp_permissions(who.username)
        return rights is not None and rights.allows(permission, name or "amq.default")

    def amqp_vhost_allowed(self, who: Principal) -> bool:
        """Some AMQP permissions were granted (an ``amqp`` line): as RabbitMQ, a user without
        any may not open the vhost."""
        return self.acl is None or self.acl.amqp_permissions(who.username) is not None

    # -- refusals ------------------------------------------------------------------------------
    def denied(self, who: Principal, action: str, resource: str, text: str | None = None) -> str:
        """Count and log a refusal; the text for the protocol's error (``text`` when given, as a
        protocol words it)."""
        key = (who.protocol, action)
        self.stats.denied[key] = self.stats.denied.get(key, 0) + 1
        user = who.username if who.username is not None else "(anonymous)"
        text = text if text is not None else f"{action} of {resource!r} refused for user {user!r}"
        now = time.monotonic()
        log_key = (who.protocol, who.username, action)
        entry = self._logged.get(log_key)
        if entry is not None and now - entry[0] < LOG_INTERVAL_S:
            entry[1] += 1
            return text
        suppressed = int(entry[1]) if entry is not None else 0
        if len(self._logged) >= MAX_LOG_KEYS:
            self._logged.clear()
        self._logged[log_key] = [now, 0]
        log.info("access denied protocol=%s user=%s client=%s peer=%s action=%s resource=%r more_since_last=%d",
                 who.protocol, user, who.client_id or "-", who.peer or "-", action, resource, suppressed)
        return text


class MqttAccess:
    """The ``Acl`` interface the MQTT gateway calls (user name, client id, topic), answered by
    the ``Authorizer`` so that MQTT's refusals are counted and logged as the others'."""

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    def _check(self, allowed: bool, username: str | None, client_id: str, action: str, topic: str) -> bool:
        if not allowed:
            self.authorizer.denied(Principal("mqtt", username, client_id), action, topic)
        return allowed

    def allows_publish(self, username: str | None, client_id: str, topic: str) -> bool:
        who = Principal("mqtt", username, client_id)
        return self._check(self.authorizer.can_write(who, topic), username, client_id, "publish", topic)

    def allows_subscribe(self, username: str | None, client_id: str, topic_filter: str) -> bool:
        who = Principal("mqtt", username, client_id)
        return self._check(self.authorizer.can_subscribe(who, topic_filter), username, client_id, "subscribe",
                           topic_filter)

    def allows_read(self, username: str | None, client_id: str, topic: str) -> bool:
        # a delivery skipped by a deny rule: the subscription was allowed, no refusal to log
        return self.authorizer.can_read(Principal("mqtt", username, client_id), topic)

    def checks_deliveries(self, username: str | None, client_id: str, topic_filters: Iterable[str] = ()) -> bool:
        return self.authorizer.checks_reads(Principal("mqtt", username, client_id), topic_filters)
