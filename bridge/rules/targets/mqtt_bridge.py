"""A remote MQTT broker as a rule's target (the edge-to-cloud uplink): each event published at
QoS 1 on the topic template, over one persistent connection (aiomqtt, paho-mqtt under asyncio),
with TLS and credentials. An event is delivered once the remote's PUBACK came; a refused
connection, a lost one or a PUBACK that does not come in time is retried under the rule's policy,
which paces the reconnections too."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ..events import CloudEvent
from ..transforms import Payload
from .mqtt_options import MqttBridgeOptions
from .outcome import DELIVERED, Outcome
from .probe import refused, until_listening
from .topic import EVENT_ID_PROPERTY, EVENT_SOURCE_PROPERTY

log = logging.getLogger("tidemq.rules")

MAX_INFLIGHT = 64  # QoS 1 publishes awaiting their PUBACK on the connection at once


class MqttBridgeTarget:
    def __init__(self, options: MqttBridgeOptions, client_id: str) -> None:
        self.options = options
        self.client_id = options.client_id or client_id
        self.label = options.label
        self._client: aiomqtt.Client | None = None
        self._connecting = asyncio.Lock()

    async def deliver(self, event: CloudEvent, payload: Payload) -> Outcome:
        return (await self.deliver_batch([(event, payload)]))[1]

    async def deliver_batch(self, items: Sequence[tuple[CloudEvent, Payload]]) -> tuple[int, Outcome]:
        """Publish every event at once, in order (paho sends them in the order given); how many
        leading ones the remote acknowledged, and why the next one was not."""
        try:
            client = await self._connected()
        except (aiomqtt.MqttError, OSError, ssl.SSLError) as exc:
            return 0, Outcome(False, f"connect: {_reason(exc)}", unreachable=refused(exc))
        publishes = [asyncio.ensure_future(self._publish(client, event, payload)) for event, payload in items]
        results = await asyncio.gather(*publishes, return_exceptions=True)
        for done, result in enumerate(results):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                await self._drop()  # (what was in flight is sent again on a new connection)
                return done, Outcome(False, f"publish: {_reason(result)}")
        return len(items), DELIVERED

    async def _publish(self, client: aiomqtt.Client, event: CloudEvent, payload: Payload) -> None:
        properties = None
        if self.options.version == "5":
            properties = Properties(PacketTypes.PUBLISH)
            if payload.content_type:
                properties.ContentType = payload.content_type
            properties.UserProperty = [(EVENT_ID_PROPERTY, event.id), (EVENT_SOURCE_PROPERTY, event.source)]
        await client.publish(self.options.topic_for(event.topic), payload.body, qos=1, properties=properties,
                             timeout=self.options.timeout_s)

    async def _connected(self) -> aiomqtt.Client:
        async with self._connecting:
            if self._client is not None and self._client._client.is_connected():  # (aiomqtt has no public state)
                return self._client
            await self._drop()
            client = aiomqtt.Client(
                self.options.host, self.options.port, username=self.options.username,
                password=self.options.password, identifier=self.client_id,
                protocol=aiomqtt.ProtocolVersion.V5 if self.options.version == "5" else aiomqtt.ProtocolVersion.V311,
                clean_session=True if self.options.version != "5" else None, timeout=self.options.timeout_s,
                max_inflight_messages=MAX_INFLIGHT, tls_context=self._tls_context(),
                tls_insecure=None if self.options.tls is None else not self.options.tls.verify_hostname,
                logger=log)
            await client.__aenter__()
            self._client = client
            log.info("rule mqtt target connected url=%s client_id=%s", self.options.url, self.client_id)
            return client

    def _tls_context(self) -> ssl.SSLContext | None:
        tls = self.options.tls
        if tls is None:
            return None
        context = ssl.create_default_context(cafile=tls.ca_file)
        context.check_hostname = tls.verify_hostname
        if tls.cert_file is not None:
            context.load_cert_chain(tls.cert_file, tls.key_file)
        return context

    async def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            lost = client._disconnected  # (aiomqtt keeps why the connection was lost here; taken, not logged)
            if lost.done() and not lost.cancelled():
                lost.exception()
            try:
                await asyncio.wait_for(client.__aexit__(None, None, None), self.options.timeout_s)
            except Exception:  # (a connection already lost: nothing to close politely)
                pass

    async def reachable(self) -> None:
        await until_listening(self.options.host, self.options.port)

    async def close(self) -> None:
        async with self._connecting:
            await self._drop()


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
