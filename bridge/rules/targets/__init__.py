"""Where a rule sends what it matched: a TideMQ topic (``topic.py``) or an HTTP webhook
(``webhook.py``); each answers an attempt with an ``Outcome`` (``outcome.py``)."""

from .outcome import DELIVERED, BatchTarget, Outcome, Target
from .topic import Republish, Republished, TopicTarget
from .webhook import WebhookTarget

__all__ = ["DELIVERED", "BatchTarget", "Outcome", "Republish", "Republished", "Target", "TopicTarget", "WebhookTarget"]
