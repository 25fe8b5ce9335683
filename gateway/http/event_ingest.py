"""CloudEvents in over HTTP: ``POST /data/events/{topic}`` takes one event in binary or
structured mode, or a batch (``application/cloudevents-batch+json``), checks each (the
required attributes, and the JSON Schema of its type when one is registered), and stores them
on the MQTT topic ``{topic}`` -- an event bus is a topic namespace -- as if an MQTT 5.0 client
had published them at QoS 1: the attributes as ``ce-`` user properties, the data's type as the
content type. So rules see the event with its own attributes, and every protocol's subscribers
see the message. On a cluster's gateway node the put goes through its store link, as its MQTT
clients' do, and the schemas are its store node's, read per request. Answered 200 once the put is durable; nothing of a request with one bad event
is stored. Authenticated as the rest of ``/data/``, with the caller's publish right on the topic.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, Metric

from protocols.cloudevents import CloudEventError, Envelope, from_http, to_properties
from protocols.mqtt.packets import Publish
from protocols.mqtt.properties import Properties
from protocols.mqtt.topics import TopicError, validate_topic_name
from store import StoreError

from .data_access import PRINCIPAL, DataAccess
from .data_publish import read_body
from .errors import AdminError

if TYPE_CHECKING:
    from ..mqtt.broker import MQTTBroker
    from ..pressure import StorePressure
    from .deps import EventSchemas, SchemaSource, Status

log = logging.getLogger("tidemq.data")

CLIENT_ID = "cloudevents"  # the client id the stored messages carry (MQTT subscribers see it nowhere)
MAX_EVENTS = 10_000  # per batch
MAX_BODY_BYTES = 4 << 20  # per request
PACKET_OVERHEAD = 16  # a PUBLISH's fixed header, topic length and packet id, roughly


def add_routes(app: web.Application, mqtt: MQTTBroker | None, access: DataAccess, status: Status,
               pressure: StorePressure | None, schemas: EventSchemas | None,
               schema_source: SchemaSource | None = None) -> EventIngest:
    ingest = EventIngest(mqtt, access, status, pressure, schemas, schema_source)
    app.router.add_post("/data/events/{topic:.+}", ingest.post)
    return ingest


class EventIngest:
    def __init__(self, mqtt: MQTTBroker | None, access: DataAccess, status: Status, pressure: StorePressure | None,
                 schemas: EventSchemas | None, schema_source: SchemaSource | None = None) -> None:
        self.mqtt = mqtt
        self.access = access
        self.status = status
        self.pressure = pressure
        self.schemas = schemas  # the node's own (it keeps the rules)
        self.schema_source = schema_source  # else a gateway node's: its store node's, read per request
        self.counts: Counter[str] = Counter()  # events by outcome: stored, malformed, schema

    async def post(self, request: web.Request) -> web.Response:
        broker, schemas = self.mqtt, self.schemas
        if broker is None:
            raise AdminError(503, "CloudEvents are stored as MQTT messages: this gateway runs no MQTT (--mqtt-bind)")
        if schemas is None and self.schema_source is None:
            raise AdminError(501, "CloudEvents are taken on a node with the store and an MQTT listener, or on a "
                                  "cluster's gateway node (where the event schemas can be read), not on this one")
        if not self.status.ready:
            raise AdminError(503, "the gateway is starting or stopping")
        if self.pressure is not None and self.pressure.raised:
            raise AdminError(503, f"publishers are blocked: {self.pressure.reason}")
        topic = request.match_info["topic"]
        try:
            validate_topic_name(topic)
        except TopicError as exc:
            raise AdminError(400, f"not a topic name: {exc}") from None
        if topic.startswith("$"):
            raise AdminError(400, "topics starting with '$' are reserved for the broker")
        self.access.check_publish(request.get(PRINCIPAL), {topic})
        body = await read_body(request, MAX_BODY_BYTES)
        try:
            events = from_http(request.headers.get("Content-Type", ""), request.headers, body)
        except CloudEventError as exc:
            self.counts["malformed"] += 1
            raise AdminError(400, f"not a valid CloudEvent: {exc.reason}") from None
        if len(events) > MAX_EVENTS:
            raise AdminError(413, f"at most {MAX_EVENTS} events per batch")
        if schemas is None:
            assert self.schema_source is not None
            try:
                schemas = await self.schema_source.current(str(event.attributes["type"]) for event in events)
            except (OSError, StoreError) as exc:
                raise AdminError(503, f"the event schemas could not be read from the store node, retry: {exc}") from None
        publishes = []
        for i, event in enumerate(events):
            where = f"event [{i}] " if len(events) > 1 else "the event "
            violation = schemas.check_body(str(event.attributes["type"]), event.data, event.content_type)
            if violation is not None:
                self.counts["schema"] += 1
                raise AdminError(400, f"{where}does not fit its schema: {violation}")
            publish = _publish(topic, event)
            if _size(publish) > broker.settings.max_packet_size:
                raise AdminError(413, f"{where}is larger than the gateway's maximum packet size of "
                                      f"{broker.settings.max_packet_size} bytes")
            publishes.append(publish)
        if publishes:
            try:
                await broker.publish(publishes, CLIENT_ID)
            except StoreError as exc:
                log.error("cloudevents not stored count=%d error=%s", len(publishes), exc)
                raise AdminError(503, f"not stored, retry: {exc}") from None
        self.counts["stored"] += len(publishes)
        return web.json_response({"topic": topic, "stored": len(publishes),
                                  "ids": [str(event.attributes["id"]) for event in events]})


def _publish(topic: str, event: Envelope) -> Publish:
    return Publish(topic, event.data, 1, False, properties=Properties(
        content_type=event.content_type, user_properties=to_properties(event.attributes)))


def _size(publish: Publish) -> int:
    properties = publish.properties
    extra = sum(len(k) + len(v) + 5 for k, v in properties.user_properties) + len(properties.content_type or "")
    return len(publish.payload) + len(publish.topic.encode()) + extra + PACKET_OVERHEAD


class IngestCollector:
    """``tidemq_cloudevents_total``: events stored, and requests refused as malformed or for a
    schema."""

    def __init__(self, ingest: EventIngest) -> None:
        self.ingest = ingest

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("tidemq_cloudevents", "CloudEvents POSTed to /data/events/ by outcome (stored: "
                                     "events; malformed, schema: requests refused)", labels=["result"])
        for result in ("stored", "malformed", "schema"):
            family.add_metric([result], self.ingest.counts[result])
        yield family
