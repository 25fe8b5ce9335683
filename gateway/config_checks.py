"""The checks of a loaded configuration (``validate``: each value, and what a role needs) and
the parsers of the values that are more than one field's type (binds, names, peers, the
tables of declared event rules and schemas). ``ConfigError`` says which value and why."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .queue_policy import RuleError, parse_rules
from .trace import parse_listeners

if TYPE_CHECKING:
    from .config import Config


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message says which and why. ``key`` is the
    field at fault, when one is: load_config adds where its value came from."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def event_rules(cfg: Config) -> dict[str, Any]:
    """The declared event rules: name -> definition (checked when the rules start: server.py)."""
    return _json_table(cfg.event_rules, "event_rules", "rule name -> definition ([event_rules.NAME])")


def _json_table(value: str, key: str, what: str) -> dict[str, Any]:
    """A setting holding a table as JSON (the config file's ``[key.NAME]`` tables): {} when unset."""
    if not value:
        return {}
    try:
        table = json.loads(value)
    except ValueError as exc:
        raise ConfigError(f"{key}: not a JSON object of {what}: {exc}", key) from None
    if not isinstance(table, dict):
        raise ConfigError(f"{key}: a table of {what}", key)
    return table


def event_schemas(cfg: Config) -> dict[str, Any]:
    """The declared event schemas: name -> JSON Schema (a path read from its JSON file; the
    schemas are checked when the rules start: server.py)."""
    schemas = _json_table(cfg.event_schemas, "event_schemas", "name -> JSON Schema (a table, or a JSON file's path)")
    out = {}
    for name, schema in schemas.items():
        if isinstance(schema, str):
            try:
                schema = json.loads(Path(schema).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ConfigError(f"event_schemas: {name!r}: cannot read the JSON Schema in {schema}: {exc}",
                                  "event_schemas") from None
        out[name] = schema
    return out


def validate(cfg: Config) -> None:
    if cfg.flush not in ("sync", "async"):
        raise ConfigError(f"flush must be 'sync' or 'async', not {cfg.flush!r}", "flush")
    for name in ("mqtt_bind", "amqp_bind", "remoting_bind", "grpc_bind", "grpcs_bind", "metrics_bind", "mqtts_bind",
                 "ws_bind"):
        parse_bind(getattr(cfg, name), name)
    validate_admin_access(cfg)
    for name in ("mqtts_bind", "grpcs_bind"):
        if getattr(cfg, name) and not (cfg.tls_cert_file and cfg.tls_key_file):
            raise ConfigError(f"{name} needs tls_cert_file and tls_key_file", name)
    for name in ("mqtt_receive_maximum", "mqtt_max_inflight"):
        if not 1 <= getattr(cfg, name) <= 65_535:
            raise ConfigError(f"{name} is 1..65535, not {getattr(cfg, name)}", name)
    if not 64 <= cfg.mqtt_max_packet_size <= 268_435_460:
        raise ConfigError("mqtt_max_packet_size is 64..268435460 bytes", "mqtt_max_packet_size")
    if cfg.mqtt_max_packet_size > cfg.max_message_size:
        raise ConfigError(f"mqtt_max_packet_size ({cfg.mqtt_max_packet_size}) may not exceed max_message_size "
                          f"({cfg.max_message_size}): the store could take no publish of that size",
                          "mqtt_max_packet_size")
    if not 0 <= cfg.mqtt_progress_save_interval_s <= 3600:
        raise ConfigError("mqtt_progress_save_interval_s is 0..3600 seconds", "mqtt_progress_save_interval_s")
    if cfg.remoting_transaction_timeout_s < 0 or cfg.remoting_transaction_check_interval_s <= 0 \
            or cfg.remoting_transaction_check_max < 0:
        raise ConfigError("remoting_transaction_timeout_s is 0 or more, remoting_transaction_check_interval_s more than "
                          "0, remoting_transaction_check_max 0 or more", "remoting_transaction_check_interval_s")
    if cfg.queue_idle_ttl_hours < 0 or cfg.queue_idle_check_interval_s <= 0 or cfg.retention_check_interval_s <= 0:
        raise ConfigError("queue_idle_ttl_hours is 0 (never) or more; queue_idle_check_interval_s and "
                          "retention_check_interval_s are more than 0", "queue_idle_ttl_hours")
    event_rules(cfg)
    event_schemas(cfg)
    try:
        parse_rules(cfg.retention_topics)
    except RuleError as exc:
        raise ConfigError(str(exc), "retention_topics") from None
    if not 0 < cfg.connect_timeout_s <= 3600:
        raise ConfigError("connect_timeout_s is more than 0 and at most 3600 seconds", "connect_timeout_s")
    if not 0 < cfg.read_timeout_s <= 3600:
        raise ConfigError("read_timeout_s is more than 0 and at most 3600 seconds", "read_timeout_s")
    if cfg.remoting_idle_timeout_s < 0:
        raise ConfigError("remoting_idle_timeout_s is 0 (never) or more seconds", "remoting_idle_timeout_s")
    if cfg.event_loop not in ("auto", "uvloop", "asyncio"):
        raise ConfigError(f"event_loop must be auto, uvloop or asyncio, not {cfg.event_loop!r}", "event_loop")
    if cfg.role not in ("embedded", "store", "gateway"):
        raise ConfigError(f"role must be embedded, store or gateway, not {cfg.role!r}", "role")
    if cfg.notify_routing not in ("targeted", "broadcast"):
        raise ConfigError(f"notify_routing must be targeted or broadcast, not {cfg.notify_routing!r}", "notify_routing")
    if cfg.lookup_backend not in ("embedded", "redis"):
        raise ConfigError(f"lookup_backend must be embedded or redis, not {cfg.lookup_backend!r}", "lookup_backend")
    if cfg.lookup_backend == "embedded" and cfg.peers:
        parse_peers(cfg.peers)
        if parse_bind(cfg.lookup_bind, "lookup_bind") is None:
            raise ConfigError("the embedded lookup (peers) needs lookup_bind, this node's lookup HOST:PORT", "peers")
    if cfg.lookup_backend == "redis" and not cfg.redis_url:
        raise ConfigError("lookup_backend redis needs redis_url (redis://host:port/db)", "lookup_backend")
    validate_replication(cfg)
    validate_grpc(cfg)
    if cfg.role == "gateway":
        if not cfg.replication_group and parse_bind(cfg.store_address, "store_address") is None:
            raise ConfigError("role gateway needs store_address, the store node's remoting HOST:PORT", "role")
        if "remoting_bind" not in cfg.source:
            cfg.remoting_bind = ""  # (when set: RocketMQ clients relayed to the store node's listener)
        if "amqp_bind" not in cfg.source:
            cfg.amqp_bind = ""  # (when set: AMQP clients relayed to the store node's listener)
    if cfg.role == "store":
        if (cfg.password_file or cfg.acl_file or cfg.access_keys_file) and not cfg.cluster_token:
            raise ConfigError("role store with a password file, ACL or access keys needs cluster_token: the store "
                              "link serves the whole store to whoever connects without it", "cluster_token")
        if not cfg.remoting_bind:
            raise ConfigError("role store serves gateway nodes on the remoting listener: set remoting_bind", "role")
        for name in ("mqtts_bind", "ws_bind"):
            if getattr(cfg, name):
                raise ConfigError(f"{name}: in a cluster, MQTT clients connect to the gateway nodes", name)
        if "mqtt_bind" in cfg.source and cfg.mqtt_bind:
            raise ConfigError("mqtt_bind: in a cluster, MQTT clients connect to the gateway nodes", "mqtt_bind")
        cfg.mqtt_bind = ""
    try:
        parse_listeners(cfg.trace)
    except ValueError as exc:
        raise ConfigError(f"trace: {exc}", "trace") from None
    if cfg.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log_level must be DEBUG, INFO, WARNING or ERROR, not {cfg.log_level!r}", "log_level")
    cfg.store_options()


def validate_replication(cfg: Config) -> None:
    """A replicated group's settings, when a replication_group is set."""
    if not cfg.replication_group:
        return
    if cfg.role not in ("store", "gateway"):
        raise ConfigError("replication_group: a replicated store is served by role store nodes (gateway nodes "
                          "follow its leader)", "replication_group")
    if parse_bind(cfg.etcd_endpoint, "etcd_endpoint") is None:
        raise ConfigError("replication_group needs etcd_endpoint, the HOST:PORT of etcd's client URL", "etcd_endpoint")
    if cfg.role == "gateway":
        return
    if not cfg.node_id:
        raise ConfigError("a store node of a replication_group needs its node_id, unique in the group", "node_id")
    replication = parse_bind(cfg.replication_bind, "replication_bind")
    if replication is None:
        raise ConfigError("a store node of a replication_group needs replication_bind, where followers read "
                          "its commitlog", "replication_bind")
    if not is_loopback(replication[0]) and not cfg.cluster_token:
        raise ConfigError(f"replication_bind {cfg.replication_bind} is reachable beyond this host and streams every "
                          "message, session and offset to whoever connects: set cluster_token (on every node of "
                          "the group) or bind it to 127.0.0.1", "replication_bind")
    if cfg.replication not in ("sync", "async"):
        raise ConfigError(f"replication must be sync or async, not {cfg.replication!r}", "replication")
    if not 1 <= cfg.min_insync_replicas <= 16:
        raise ConfigError("min_insync_replicas is 1..16", "min_insync_replicas")
    if not 1 <= cfg.replication_lease_s <= 60:
        raise ConfigError("replication_lease_s is 1..60 seconds (etcd leases are whole seconds)", "replication_lease_s")
    if not 0.1 <= cfg.replication_lag_s <= 600 or not 0.1 <= cfg.replication_timeout_s <= 600:
        raise ConfigError("replication_lag_s and replication_timeout_s are 0.1..600 seconds", "replication_lag_s")


def validate_admin_access(cfg: Config) -> None:
    """The admin API serves every message body and can kick clients: a listener reachable from
    other hosts must have admin credentials, and admin users must be users of the password file."""
    if parse_names(cfg.admin_users) and not cfg.password_file:
        raise ConfigError("admin_users are users of the password file: set password_file too", "admin_users")
    metrics = parse_bind(cfg.metrics_bind, "metrics_bind")
    if metrics is not None and not is_loopback(metrics[0]) and not (cfg.admin_token or parse_names(cfg.admin_users)):
        raise ConfigError(f"metrics_bind {cfg.metrics_bind} is reachable beyond this host, and its admin API (every "
                          "message body, kicking clients) would have no credentials: set admin_token, or admin_users "
                          "with a password_file, or bind it to 127.0.0.1", "metrics_bind")


def parse_names(text: str) -> frozenset[str]:
    """``"root, ops"`` -> {"root", "ops"}."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def is_loopback(host: str) -> bool:
    """Whether a bind address is reachable from this host only (a host name other than
    ``localhost`` is taken as reachable from elsewhere)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def validate_grpc(cfg: Config) -> None:
    """The gRPC listener (plain, TLS or both) is served by the remoting node (embedded or
    store), with its access keys and ACL; a gateway node's proxies each call there."""
    for name in ("grpc_bind", "grpcs_bind"):
        if not getattr(cfg, name):
            continue
        if cfg.role == "gateway":
            continue  # (the calls proxied to the store node's plain gRPC listener: cluster/grpc_proxy.py)
        if not cfg.remoting_bind:
            raise ConfigError(f"{name} needs remoting_bind: the gRPC calls are answered by the remoting node", name)


def parse_bind(bind: str, name: str = "bind") -> tuple[str, int] | None:
    """``HOST:PORT`` -> (host, port); empty -> None (listener off)."""
    bind = bind.strip()
    if not bind:
        return None
    host, sep, port = bind.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{name}: expected HOST:PORT, got {bind!r}", name)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{name}: port must be a number, got {port!r}", name) from None
    if not 0 <= number <= 65535:
        raise ConfigError(f"{name}: port {number} out of range", name)
    return host, number


def parse_peers(text: str) -> dict[str, tuple[str, int]]:
    """``"g1=10.0.0.2:7001,g2=10.0.0.3:7001"`` -> {node id: (host, port)}."""
    peers = {}
    for part in text.split(","):
        if not part.strip():
            continue
        node, sep, address = part.strip().partition("=")
        bind = parse_bind(address, f"peers ({node})") if sep and node else None
        if bind is None:
            raise ConfigError(f"peers: {part.strip()!r} is not NODE=HOST:PORT", "peers")
        peers[node] = bind
    return peers
