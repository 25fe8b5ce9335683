"""Where a rule sends what it matched: a TideMQ topic (``topic.py``), an HTTP webhook
(``webhook.py``), a remote MQTT broker (``mqtt_bridge.py``) or a PostgreSQL table
(``postgres.py``), each with its checked options beside it; each answers an attempt with an
``Outcome`` (``outcome.py``)."""

from .mqtt_bridge import MqttBridgeTarget
from .outcome import DELIVERED, BatchTarget, Outcome, ProbedTarget, Target
from .postgres import PostgresTarget
from .topic import Republish, Republished, TopicTarget
from .webhook import BatchedWebhookTarget, WebhookTarget

__all__ = ["DELIVERED", "BatchTarget", "BatchedWebhookTarget", "MqttBridgeTarget", "Outcome", "PostgresTarget",
           "ProbedTarget", "Republish", "Republished", "Target", "TopicTarget", "WebhookTarget"]
