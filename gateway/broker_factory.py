"""Each protocol's broker, or its settings, made from the configuration: what each setting of
the MQTT, AMQP and remoting families means to its broker is said here, once; ``server.py``
decides which brokers a node runs and wires them to one another."""

from __future__ import annotations

import logging

from cache import QueueCache
from store import MessageStore

from .amqp.broker import AMQPBroker
from .auth import PasswordFile
from .auth.access_keys import AccessKeys
from .auth.authorize import Authorizer
from .config import Config, ConfigError
from .mqtt.queues import WildcardQueues
from .mqtt.settings import MQTTSettings
from .pressure import StorePressure
from .remoting.access import RemotingAccess
from .remoting.broker import RemotingBroker
from .remoting.schedule import parse_delay_levels
from .remoting.transactions import TransactionSettings
from .stats import ProtocolStats

log = logging.getLogger("tidemq.gateway")


def mqtt_settings(cfg: Config) -> MQTTSettings:
    return MQTTSettings(
        receive_maximum=cfg.mqtt_receive_maximum,
        max_inflight=cfg.mqtt_max_inflight,
        # (a store of small segments takes smaller messages: no packet it would refuse is read)
        max_packet_size=min(cfg.mqtt_max_packet_size, cfg.store_options().max_message_size),
        topic_alias_maximum=cfg.mqtt_topic_alias_maximum,
        max_queued_messages=cfg.mqtt_max_queued_messages,
        max_keepalive=cfg.mqtt_max_keepalive,
        sys_interval_s=cfg.mqtt_sys_interval_s,
        presence_events=cfg.mqtt_presence_events,
        expiry_check_interval_s=cfg.mqtt_expiry_check_interval_s,
        progress_save_interval_s=cfg.mqtt_progress_save_interval_s,
        allow_anonymous=cfg.allow_anonymous,
        connect_timeout_s=cfg.connect_timeout_s,
        read_timeout_s=cfg.read_timeout_s,
    )


def amqp_broker(cfg: Config, store: MessageStore, cache: QueueCache, *, passwords: PasswordFile | None,
                authorizer: Authorizer, pressure: StorePressure | None,
                mqtt_topics: WildcardQueues | None) -> AMQPBroker:
    """The AMQP broker (with ``mqtt_topics``: the bridge through amq.topic, docs/amqp.md)."""
    return AMQPBroker(store, cache=cache, authenticator=passwords, allow_anonymous=cfg.allow_anonymous,
                      pressure=pressure, authorizer=authorizer, connect_timeout_s=cfg.connect_timeout_s,
                      mqtt_topics=mqtt_topics, cluster_name=cfg.node_name(), read_timeout_s=cfg.read_timeout_s)


def remoting_broker(cfg: Config, store: MessageStore, cache: QueueCache, *, authorizer: Authorizer,
                    mqtt_topics: WildcardQueues | None) -> RemotingBroker:
    """The name-server and broker roles of RocketMQ 4 clients (with ``mqtt_topics``: a remoting
    topic is an MQTT first level, docs/remoting.md). With a password file, ACL or access keys,
    requests are signed with AccessKeys (remoting/access.py)."""
    try:
        delays = parse_delay_levels(cfg.remoting_delay_levels)
    except ValueError as exc:
        raise ConfigError(f"remoting_delay_levels: {exc}") from None
    required = bool(cfg.password_file or cfg.acl_file or cfg.access_keys_file)
    if required and not cfg.access_keys_file:
        log.warning("remoting requests must be signed but no access_keys_file is set: only %s",
                    "unsigned (anonymous) clients can work" if cfg.allow_anonymous else "the store link works")
    stats = ProtocolStats()
    access = RemotingAccess(authorizer, AccessKeys.load(cfg.access_keys_file) if cfg.access_keys_file else None,
                            required=required, allow_anonymous=cfg.allow_anonymous, stats=stats)
    return RemotingBroker(
        store, cache=cache, default_queues=cfg.remoting_default_queues, delay_levels=delays,
        max_reconsume_times=cfg.remoting_max_reconsume_times, long_poll_max_s=cfg.remoting_long_poll_max_s,
        access=access, stats=stats, connect_timeout_s=cfg.connect_timeout_s, mqtt_topics=mqtt_topics,
        enable_property_filter=cfg.remoting_enable_property_filter,
        idle_timeout_s=cfg.remoting_idle_timeout_s, read_timeout_s=cfg.read_timeout_s,
        transactions=TransactionSettings(cfg.remoting_transaction_timeout_s, cfg.remoting_transaction_check_interval_s,
                                         cfg.remoting_transaction_check_max))
