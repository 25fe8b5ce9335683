"""Locust load test for the MQTT gateway, as users run one:

    locust -f loadtest/locustfile_mqtt.py --headless -u 50 -r 10 -t 60s --host mqtt://127.0.0.1:1883

Each simulated user is one paho-mqtt client (MQTT 5) that subscribes to its own topic
``locust/{user}`` at QoS 1 and then, in a loop, publishes there at QoS 0 and at QoS 1 (weights
1 and 3, a short pause between). Locust's table shows, per name:

- ``publish qos1``: PUBLISH to PUBACK, the broker's time to make the message durable;
- ``publish qos0``: the time to hand the packet to the socket (failures only if it cannot);
- ``deliver``: publish to the same client receiving it back through the broker (end to end);
- ``connect``: CONNECT to SUBACK (connected and subscribed).

Failures are refused connections, missing PUBACKs (10 s) and lost deliveries (a message not
received within 10 s). Payloads are 64 bytes with the send time in them.
"""

from __future__ import annotations

import struct
import threading
import time
import uuid
from urllib.parse import urlparse

import paho.mqtt.client as mqtt
from locust import User, between, events, task
from paho.mqtt.enums import CallbackAPIVersion

TIMEOUT_S = 10.0
PAYLOAD = 64
_STAMP = struct.Struct(">d")


class MQTTUser(User):
    wait_time = between(0.05, 0.2)

    def on_start(self) -> None:
        url = urlparse(self.host or "mqtt://127.0.0.1:1883")
        self.topic = f"locust/{uuid.uuid4().hex[:12]}"
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.topic.replace("/", "-"),
                                  protocol=mqtt.MQTTv5)
        self.lock = threading.Lock()
        self.waiting: dict[float, float] = {}  # send stamp -> deadline, for deliveries not yet seen
        self.client.on_message = self._on_message
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *args: subscribed.set()
        started = time.perf_counter()
        try:
            self.client.connect(url.hostname or "127.0.0.1", url.port or 1883, keepalive=30)
            self.client.loop_start()
            self.client.subscribe(self.topic, qos=1)
            if not subscribed.wait(TIMEOUT_S):  # publishing before the SUBACK would lose deliveries
                raise TimeoutError("no SUBACK in 10 s")
            self._fire("connect", started, None)
        except (OSError, TimeoutError) as exc:
            self._fire("connect", started, exc)
            raise

    def on_stop(self) -> None:
        deadline = time.monotonic() + 2.0  # what is on its way may still arrive
        while self.waiting and time.monotonic() < deadline:
            time.sleep(0.05)
        self._expire(time.time() + TIMEOUT_S + 1)  # whatever is still missing now is lost
        self.client.disconnect()
        self.client.loop_stop()

    @task(3)
    def publish_qos1(self) -> None:
        started = time.perf_counter()
        info = self.client.publish(self.topic, self._payload(), qos=1)
        info.wait_for_publish(TIMEOUT_S)
        self._fire("publish qos1", started, None if info.is_published() else TimeoutError("no PUBACK in 10 s"))
        self._expire(time.time())

    @task(1)
    def publish_qos0(self) -> None:
        started = time.perf_counter()
        info = self.client.publish(self.topic, self._payload(), qos=0)
        error = None if info.rc == mqtt.MQTT_ERR_SUCCESS else ConnectionError(mqtt.error_string(info.rc))
        self._fire("publish qos0", started, error)

    # -- deliveries ----------------------------------------------------------------------------
    def _payload(self) -> bytes:
        stamp = time.time()
        with self.lock:
            self.waiting[stamp] = stamp + TIMEOUT_S
        return _STAMP.pack(stamp) + bytes(PAYLOAD - _STAMP.size)

    def _on_message(self, client, userdata, message) -> None:
        (stamp,) = _STAMP.unpack_from(message.payload)
        with self.lock:
            known = self.waiting.pop(stamp, None) is not None
        if known:
            events.request.fire(request_type="MQTT", name="deliver", response_time=(time.time() - stamp) * 1000,
                                response_length=len(message.payload), exception=None, context={})

    def _expire(self, now: float) -> None:
        with self.lock:
            lost = [s for s, deadline in self.waiting.items() if deadline < now]
            for stamp in lost:
                del self.waiting[stamp]
        for stamp in lost:
            events.request.fire(request_type="MQTT", name="deliver", response_time=TIMEOUT_S * 1000,
                                response_length=0, exception=TimeoutError("not delivered in 10 s"), context={})

    def _fire(self, name: str, started: float, error: Exception | None) -> None:
        events.request.fire(request_type="MQTT", name=name, response_time=(time.perf_counter() - started) * 1000,
                            response_length=PAYLOAD, exception=error, context={})
