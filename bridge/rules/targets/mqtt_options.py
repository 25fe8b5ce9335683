"""The options of an MQTT bridge target as a rule's definition gives them (``{"type": "mqtt",
"url": "mqtts://cloud.example:8883", "topic": "site1/${topic}", ...}``), checked once: the
remote's address, TLS, credentials, MQTT version and the topic template."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from protocols.mqtt.topics import TopicError, validate_topic_name

from ..errors import RuleDefinitionError

KEYS = frozenset({"type", "url", "topic", "qos", "username", "password", "client_id", "version", "tls", "timeout_s"})
TLS_KEYS = frozenset({"ca_file", "cert_file", "key_file", "verify_hostname"})
TOPIC_VARIABLE = "${topic}"  # the source message's topic
VERSIONS = ("5", "3.1.1")
CLIENT_ID = re.compile(r"[\x21-\x7e]{1,128}")


@dataclass(slots=True, frozen=True)
class MqttTls:
    ca_file: str | None = None  # None: the system's certificate authorities
    cert_file: str | None = None  # a client certificate (with key_file)
    key_file: str | None = None
    verify_hostname: bool = True


@dataclass(slots=True, frozen=True)
class MqttBridgeOptions:
    host: str
    port: int
    topic: str  # a template: ``${topic}`` is replaced by the source message's topic
    tls: MqttTls | None
    username: str | None = None
    password: str | None = None
    client_id: str | None = None  # None: made from the rule's name
    version: str = "5"
    timeout_s: float = 10.0

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    @property
    def label(self) -> str:
        return f"mqtt:{self.url}/{self.topic}"

    def topic_for(self, source_topic: str) -> str:
        return self.topic.replace(TOPIC_VARIABLE, source_topic)


def parse_mqtt_options(item: dict[str, Any], path: str) -> MqttBridgeOptions:
    """The checked options of an ``mqtt`` target (RuleDefinitionError with the JSON path when bad)."""
    unknown = sorted(set(item) - KEYS)
    if unknown:
        raise RuleDefinitionError(f"{path}.{unknown[0]}", f"unknown key (known: {', '.join(sorted(KEYS))})")
    url = item.get("url")
    parsed = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    try:
        port = parsed.port if parsed is not None else None
    except ValueError:
        parsed = None
    if parsed is None or parsed.scheme not in ("mqtt", "mqtts") or not parsed.hostname or parsed.path not in ("", "/") \
            or parsed.username or parsed.query:
        raise RuleDefinitionError(f"{path}.url", "mqtt://HOST[:PORT] or mqtts://HOST[:PORT] (TLS); credentials "
                                                 "go in username and password")
    secure = parsed.scheme == "mqtts"
    tls = _tls(item.get("tls", {}), f"{path}.tls") if secure else None
    if not secure and "tls" in item:
        raise RuleDefinitionError(f"{path}.tls", "TLS options need an mqtts:// URL")
    topic = item.get("topic", TOPIC_VARIABLE)
    if not isinstance(topic, str):
        raise RuleDefinitionError(f"{path}.topic", "a topic name, where ${topic} stands for the source message's topic")
    try:
        validate_topic_name(topic.replace(TOPIC_VARIABLE, "a/b"))
    except TopicError as exc:
        raise RuleDefinitionError(f"{path}.topic", f"not a topic name: {exc}") from None
    if "${" in topic.replace(TOPIC_VARIABLE, ""):
        raise RuleDefinitionError(f"{path}.topic", "the only variable of a topic template is ${topic}")
    if item.get("qos", 1) != 1 or isinstance(item.get("qos", 1), bool):
        raise RuleDefinitionError(f"{path}.qos", "1: the bridge publishes at QoS 1 and moves on only after the "
                                                 "remote's PUBACK (QoS 0 could lose events; QoS 2 is not offered)")
    username, password = item.get("username"), item.get("password")
    for key, value in (("username", username), ("password", password)):
        if value is not None and not isinstance(value, str):
            raise RuleDefinitionError(f"{path}.{key}", "a string")
    if password is not None and username is None:
        raise RuleDefinitionError(f"{path}.password", "a password needs a username")
    client_id = item.get("client_id")
    if client_id is not None and (not isinstance(client_id, str) or not CLIENT_ID.fullmatch(client_id)):
        raise RuleDefinitionError(f"{path}.client_id", "1-128 printable ASCII characters, no space")
    version = item.get("version", "5")
    if version not in VERSIONS:
        raise RuleDefinitionError(f"{path}.version", f"one of {', '.join(VERSIONS)} (a string)")
    timeout = item.get("timeout_s", 10.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 300:
        raise RuleDefinitionError(f"{path}.timeout_s", "more than 0 and at most 300 seconds")
    return MqttBridgeOptions(parsed.hostname, port or (8883 if secure else 1883), topic, tls, username, password,
                             client_id, version, float(timeout))


def _tls(raw: Any, path: str) -> MqttTls:
    if not isinstance(raw, dict):
        raise RuleDefinitionError(path, "an object")
    unknown = sorted(set(raw) - TLS_KEYS)
    if unknown:
        raise RuleDefinitionError(f"{path}.{unknown[0]}", f"unknown key (known: {', '.join(sorted(TLS_KEYS))})")
    for key in ("ca_file", "cert_file", "key_file"):
        if key in raw and not isinstance(raw[key], str):
            raise RuleDefinitionError(f"{path}.{key}", "a file path")
    if ("cert_file" in raw) != ("key_file" in raw):
        raise RuleDefinitionError(f"{path}.cert_file", "a client certificate needs both cert_file and key_file")
    verify = raw.get("verify_hostname", True)
    if not isinstance(verify, bool):
        raise RuleDefinitionError(f"{path}.verify_hostname", "true or false")
    return MqttTls(raw.get("ca_file"), raw.get("cert_file"), raw.get("key_file"), verify)
