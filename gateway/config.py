"""One typed configuration object, loaded from defaults < TOML file < TIDEMQ_* environment < CLI flags.

The TOML file uses the field names below, either flat (``mqtt_bind = "..."``) or in a
table whose name is the first word (``[mqtt] bind = "..."``, ``[store] segment_size = ...``).
A bind is ``HOST:PORT`` (``[::1]:1883`` for IPv6; ``localhost`` is both loopbacks, see
gateway/listen.py); an empty bind turns that listener off. The loaded values are checked by
gateway/config_checks.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store import StoreOptions

from .config_checks import (
    ConfigError,
    event_rules,
    event_schemas,
    is_loopback,
    parse_bind,
    parse_names,
    parse_peers,
    validate,
)

__all__ = ["Config", "ConfigError", "event_rules", "event_schemas", "is_loopback", "load_config", "parse_bind",
           "parse_names", "parse_peers", "validate"]

ENV_PREFIX = "TIDEMQ_"
# TIDEMQ_* names that are not settings: the config file's path, and the test set-up's choice of
# the compiled or interpreted build (tests/builds.py), which a gateway the tests start inherits
NOT_SETTINGS = frozenset({ENV_PREFIX + "CONFIG", ENV_PREFIX + "PURE_PYTHON"})
# settings whose TOML value is a table (kept as its JSON; gateway/queue_policy.py reads
# retention_topics, gateway/rules_host.py event_rules and event_schemas)
TABLE_SETTINGS = frozenset({"retention_topics", "event_rules", "event_schemas"})


@dataclass(slots=True)
class Config:
    # embedded: everything in one process; store: also serves its store to gateway nodes;
    # gateway: MQTT listeners over the store of the store node at store_address
    role: str = "embedded"
    store_address: str = ""  # HOST:PORT of the store node's remoting listener (role gateway)
    # this gateway node's name in the cluster and in $SYS/brokers/{node}/... (default: node_name())
    node_id: str = ""
    notify_routing: str = "targeted"  # store node: targeted (nodes that read the queue) or broadcast
    cluster_token: str = ""  # when set, gateway nodes present it to the store node (set it on both)
    # the lookup (gateway nodes): client id -> node, queue -> nodes. embedded: partitioned over
    # the gateway nodes named in peers ("g1=host:port,g2=host:port", this node included), each
    # listening on lookup_bind; redis: at redis_url. Neither configured: no lookup (takeover asks
    # every node; notify routes by the nodes' reading hints alone).
    lookup_backend: str = "embedded"
    lookup_bind: str = ""
    peers: str = ""
    redis_url: str = ""
    lookup_heartbeat_s: float = 1.0  # nodes silent 5x this long are gone; answers settle in 2.5x
    # a replicated store (docs/replication.md): store nodes of one replication_group elect their
    # leader in etcd (etcd_endpoint HOST:PORT); followers copy the leader's commitlog, which it
    # streams from replication_bind. Gateway nodes with a replication_group find the leader there
    # (store_address is then not needed). Empty: one store node, no etcd.
    replication_group: str = ""
    etcd_endpoint: str = ""
    replication_bind: str = ""
    replication_advertise: str = ""  # HOST:PORT followers reach replication_bind at (default: the bind)
    replication: str = "sync"  # sync: acknowledged once every in-sync replica holds it; async: once the leader does
    min_insync_replicas: int = 2  # sync: replicas (the leader among them) that must be in sync to take writes
    replication_lease_s: float = 2.0  # a leader silent this long in etcd loses its leadership
    replication_lag_s: float = 2.0  # a follower behind this long leaves the in-sync set
    replication_timeout_s: float = 5.0  # a write not confirmed by the in-sync replicas within this is refused
    data_dir: Path = Path("./data")
    mqtt_bind: str = "localhost:1883"  # localhost: 127.0.0.1 and ::1 (gateway/listen.py)
    amqp_bind: str = "localhost:5672"
    remoting_bind: str = "localhost:9876"
    # RocketMQ 5 clients over gRPC (gateway/rocketmq_grpc/): off unless set; needs remoting_bind (a gateway
    # node: proxied to the store node's, cluster/grpc_proxy.py)
    grpc_bind: str = ""
    grpcs_bind: str = ""  # gRPC over TLS; needs tls_cert_file and tls_key_file
    grpc_on_remoting_port: bool = True  # with grpc_bind: the remoting port takes gRPC connections too
    grpc_fifo_groups: str = ""  # consumer groups (comma-separated) whose PushConsumers consume in order
    metrics_bind: str = ""  # also serves the admin API of `tidemq ctl`
    admin_token: str = ""  # "Authorization: Bearer <token>" is the operator on /admin and /data (http/data_access.py)
    admin_users: str = ""  # password-file users (comma-separated) who are the operator there too, with HTTP Basic
    trace: str = ""  # listeners whose messages are traced: "mqtt,amqp", "all" (mqtt mqtts ws amqp remoting)
    flush: str = "async"  # sync: acknowledge after fdatasync; async: after write, fdatasync every flush_interval_ms
    flush_interval_ms: int = 200
    checkpoint_interval_s: float = 5.0
    index_flush_interval_s: float = 60.0
    segment_size: int = 1 << 30
    # a full MQTT packet (mqtt_max_packet_size) plus room for what is stored with it (its queue
    # list), and AMQP bodies of RabbitMQ 4's default limit (what larger messages cost: docs/operations.md)
    max_message_size: int = 20 << 20
    queue_cache_entries: int = 1_048_576
    # RocksDB's memory, index and metadata databases together ([rocksdb] section in TOML): one
    # block cache that also holds the index and bloom-filter blocks of every table file, and a
    # budget for write buffers (memtables are flushed early when together they reach it)
    rocksdb_cache_bytes: int = 32 << 20
    rocksdb_write_buffer_bytes: int = 32 << 20
    memory_release_interval_s: float = 10.0  # free malloc pages back to the system (docs/store.md, Memory); 0 = never
    retention_hours: float = 72.0
    retention_bytes: int = 0
    retention_check_interval_s: float = 60.0
    # per-topic retention ([retention.topics] table: topic filter -> hours or {hours, bytes});
    # the environment gives it as JSON (gateway/queue_policy.py)
    retention_topics: str = ""
    # event rules declared here ([event_rules.NAME] tables: sources, pattern, transform, targets,
    # retry, dead_letter_topic; docs/rules.md), stored at start over a stored rule of the same name;
    # the environment gives them as one JSON object of name -> definition
    event_rules: str = ""
    # event schemas declared here ([event_schemas] table: name -> a JSON Schema as a table, or the
    # path of a JSON file holding one), stored at start as the next version where they differ
    event_schemas: str = ""
    # light queues (MQTT topics and filters, AMQP queues) with no new message for this long and no
    # reader are removed (store/retention/reclaim.py); 0 = never
    queue_idle_ttl_hours: float = 24.0
    queue_idle_check_interval_s: float = 600.0
    store_host: str = "127.0.0.1"  # IPv4 encoded in message ids
    store_port: int = 10911
    repair: bool = False
    log_level: str = "INFO"
    shutdown_timeout_s: float = 10.0
    event_loop: str = "asyncio"  # asyncio, uvloop, or auto (uvloop when installed); asyncio is the default (docs/benchmarks/ records why)
    # MQTT: more listeners (empty = off) and limits ([mqtt] section in TOML)
    mqtts_bind: str = ""  # MQTT over TLS; needs tls_cert_file and tls_key_file
    ws_bind: str = ""  # MQTT over WebSocket (subprotocol "mqtt"), path /mqtt
    tls_cert_file: str = ""
    tls_key_file: str = ""
    mqtt_receive_maximum: int = 1024
    # outbound window of 3.1.1 clients (5.0 clients announce theirs): deliveries are pulled per
    # window, so a window far smaller than what publishers bring in one loop turn lets ingest
    # outrun a busy subscriber (fan-in: 1,024 -> 8,192 kept the rate, p50 8.9 s -> 0.3 s)
    mqtt_max_inflight: int = 8192
    mqtt_max_packet_size: int = 16 << 20  # as RabbitMQ 4.1 (EMQX: 1 MB, Mosquitto: no limit)
    mqtt_topic_alias_maximum: int = 64
    mqtt_max_queued_messages: int = 1000
    mqtt_max_keepalive: int = 0
    mqtt_sys_interval_s: float = 10.0
    mqtt_presence_events: bool = True  # $SYS/brokers/{node}/clients/{client_id}/(dis)connected
    mqtt_expiry_check_interval_s: float = 30.0  # how often expired sessions of absent clients end
    # the read progress of persistent sessions is saved at most this late (a crash redelivers it)
    mqtt_progress_save_interval_s: float = 1.0
    queue_cache_bytes: int = 64 << 20
    # RocketMQ remoting ([remoting] section in TOML)
    remoting_default_queues: int = 4  # read/write queues of a topic created on first use
    remoting_delay_levels: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    remoting_max_reconsume_times: int = 16  # then %DLQ%{group}, unless the client says otherwise
    remoting_max_frame_size: int = 16 << 20  # larger frames close the connection
    remoting_long_poll_max_s: float = 30.0  # a held pull is answered after at most this long
    # transactions (RocketMQ 5's transactionTimeOut, transactionCheckInterval, transactionCheckMax):
    # a half message is checked with its producer this long after it was sent, then every
    # interval, and rolled back after the last check
    remoting_transaction_timeout_s: float = 6.0
    remoting_transaction_check_interval_s: float = 30.0
    remoting_transaction_check_max: int = 15
    remoting_advertise: str = ""  # HOST:PORT clients are sent to; default: the remoting bind
    # a connection without a request this long is closed (RocketMQ's channelMaxIdleTimeSeconds;
    # clients heartbeat every 30 s); 0 = never
    remoting_idle_timeout_s: float = 120.0
    # SQL92 subscriptions (RocketMQ's enablePropertyFilter, off there by default); off: refused
    remoting_enable_property_filter: bool = True
    # resource alarm (RabbitMQ's disk alarm and flow control): publishers are blocked while the
    # disk under data_dir has less free space than this, or the store is this many messages behind
    disk_free_limit: int = 50_000_000
    store_backlog_limit: int = 100_000
    # who may connect ([auth] section in TOML); the same for every protocol
    allow_anonymous: bool = True
    password_file: str = ""  # Mosquitto format; manage with `tidemq passwd`
    acl_file: str = ""  # Mosquitto acl_file format, plus "amqp" permission lines (gateway/auth/acl.py)
    access_keys_file: str = ""  # RocketMQ AccessKey -> SecretKey, user (gateway/auth/access_keys.py)
    # every listener: a connection's CONNECT / AMQP handshake / first remoting request comes within this
    connect_timeout_s: float = 10.0
    # every listener: a connection silent this long in the middle of a frame (packet) is closed,
    # whatever keep-alive or heartbeat it agreed (none, 0, keeps a whole-frame idle connection)
    read_timeout_s: float = 60.0
    source: dict[str, str] = field(default_factory=dict, repr=False)  # field -> where its value came from

    def node_name(self) -> str:
        """node_id, or else ``gateway@`` and the first MQTT listener's bind."""
        first_bind = next((bind for bind in (self.mqtt_bind, self.mqtts_bind, self.ws_bind) if bind), "")
        return self.node_id or f"gateway@{first_bind}"

    def authentication_configured(self) -> bool:
        """Whether clients are authenticated or authorised at all: then so are HTTP callers."""
        return bool(self.password_file or self.acl_file or self.access_keys_file or not self.allow_anonymous)

    def store_options(self) -> StoreOptions:
        try:
            return StoreOptions(
                data_dir=self.data_dir,
                segment_size=self.segment_size,
                flush=self.flush,  # type: ignore[arg-type]  # (one of the modes: validated on load)
                flush_interval=self.flush_interval_ms / 1000.0,
                checkpoint_interval=self.checkpoint_interval_s,
                index_flush_interval=self.index_flush_interval_s,
                max_message_size=self.max_message_size,
                queue_cache_entries=self.queue_cache_entries,
                rocksdb_cache_bytes=self.rocksdb_cache_bytes,
                rocksdb_write_buffer_bytes=self.rocksdb_write_buffer_bytes,
                memory_release_interval=self.memory_release_interval_s,
                retention_hours=self.retention_hours,
                retention_bytes=self.retention_bytes,
                retention_check_interval=self.retention_check_interval_s,
                queue_idle_check_interval=self.queue_idle_check_interval_s,
                identity_host=self.store_host,
                identity_port=self.store_port,
                repair=self.repair,
                replicated=bool(self.replication_group) and self.role == "store",
            )
        except ValueError as exc:  # StoreOptions' messages start with the field's name (flush, segment_size)
            raise ConfigError(str(exc), str(exc).split(" ", 1)[0]) from None


def _fields() -> dict[str, type]:
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config) if f.name != "source"}


def _convert(name: str, kind: type, value: Any, origin: str) -> Any:
    if name in TABLE_SETTINGS and isinstance(value, dict):
        return json.dumps(value)
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(f"not a boolean: {value!r}")
        if kind is int:
            if isinstance(value, bool):
                raise ValueError("not an integer")
            return int(value)
        if kind is float:
            return float(value)
        if kind is Path:
            return Path(value)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return ",".join(value)  # a TOML list of names (trace = ["mqtt", "amqp"])
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {type(value).__name__}")
        return value
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{origin}: bad value for {name}: {exc}") from None


def _flatten(table: Mapping[str, Any], path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key in TABLE_SETTINGS:  # (a table of tables: [event_rules.NAME])
            out[key] = value
        elif isinstance(value, dict):
            for sub, subvalue in value.items():
                if isinstance(subvalue, dict) and f"{key}_{sub}" not in TABLE_SETTINGS:
                    raise ConfigError(f"{path}: [{key}.{sub}] nests too deep")
                out[f"{key}_{sub}"] = subvalue
        else:
            out[key] = value
    return out


def load_config(
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the configuration; ``overrides`` are CLI flags (None values are ignored)."""
    kinds = _fields()
    cfg = Config()
    env = os.environ if env is None else env
    if config_file is None and env.get(ENV_PREFIX + "CONFIG"):
        config_file = env[ENV_PREFIX + "CONFIG"]

    def apply(values: Mapping[str, Any], origin: str) -> None:
        for name, raw in values.items():
            if name not in kinds:
                raise ConfigError(f"{origin}: unknown setting {name!r}")
            setattr(cfg, name, _convert(name, kinds[name], raw, origin))
            cfg.source[name] = origin

    if config_file is not None:
        path = Path(config_file)
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        apply(_flatten(data, str(path)), str(path))
    from_env = {
        key[len(ENV_PREFIX) :].lower(): value
        for key, value in env.items()
        if key.startswith(ENV_PREFIX) and key not in NOT_SETTINGS
    }
    apply(from_env, "environment")
    apply({k: v for k, v in (overrides or {}).items() if v is not None}, "command line")
    try:
        validate(cfg)
    except ConfigError as exc:
        if exc.key in cfg.source:  # (a default's fault, e.g. a role's needs, has no source to name)
            raise ConfigError(f"{cfg.source[exc.key]}: {exc}", exc.key) from None
        raise
    return cfg
