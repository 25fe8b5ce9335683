"""Shared subscriptions on a node that cannot honour them (a gateway node of a cluster: see
``MQTTPorts.shared_refusal``): refused, never run as a group of this node alone. Each refusal
is counted by its cause; each cause is logged once, with the reason."""

from __future__ import annotations

import logging
from collections import Counter

from .session import Session, SubscriptionState

log = logging.getLogger("tidemq.mqtt")


class SharedRefusal:
    """``reason``: why this node refuses ``$share`` subscriptions, None where it serves them.
    Causes: ``subscribe`` (a SUBSCRIBE: SUBACK 0x9E, or 0x80 for 3.1.1), ``resumed`` (a stored
    session that has one, made where they were served: it is taken out of the session)."""

    def __init__(self, reason: str | None) -> None:
        self.reason = reason
        self.counts: Counter[str] = Counter()

    @property
    def available(self) -> bool:
        return self.reason is None

    def refused(self, cause: str, client_id: str, key: str) -> None:
        self.counts[cause] += 1
        if self.counts[cause] == 1:  # once per cause: a fleet of workers must not flood the log
            log.warning("shared subscription refused cause=%s client_id=%s filter=%r reason=%r "
                        "(logged once per cause, counted in tidemq_mqtt_shared_subscriptions_refused_total)",
                        cause, client_id, key, self.reason)

    def take_from(self, session: Session) -> list[SubscriptionState]:
        """A session resumed here loses its shared subscriptions (returned, for their filters to
        be released): they would be served as a group of this node alone."""
        if self.available:
            return []
        taken = []
        for key, state in list(session.subscriptions.items()):
            if state.share_group is not None:
                del session.subscriptions[key]
                taken.append(state)
                self.refused("resumed", session.client_id, key)
        return taken
