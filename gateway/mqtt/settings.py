"""Tunables of the MQTT gateway (filled from the gateway's Config)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class MQTTSettings:
    receive_maximum: int = 1024  # inbound QoS 1/2 publishes a client may have unacknowledged
    max_inflight: int = 8192  # outbound window for clients that announce no Receive Maximum (3.1.1)
    max_packet_size: int = 16 << 20  # bytes, whole packet; larger inbound packets are refused
    topic_alias_maximum: int = 64  # inbound topic aliases a 5.0 client may use
    max_queued_messages: int = 1000  # QoS 0 backlog per subscription before messages are dropped
    max_keepalive: int = 0  # 0: accept what the client asks; else the Server Keep Alive cap
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0  # a connection silent this long in the middle of a packet is closed
    allow_anonymous: bool = True
    expiry_check_interval_s: float = 30.0
    # how long the read progress of a persistent session (its queue offsets after deliveries
    # and PUBACKs) may wait to be saved; a crash within it redelivers those messages (QoS 1 allows
    # duplicates), anything else a session changes is saved at the end of the loop turn
    progress_save_interval_s: float = 1.0
    write_buffer_high: int = 1 << 20  # stop pulling for a client above this many unsent bytes
    # resume pulling below this many: a quarter of write_buffer_high (one int for all connections)
    write_buffer_low: int = field(init=False, default=0)
    # a subscriber whose unsent bytes do not fall from write_buffer_high to a quarter of it in
    # this long has stalled: publishers stop waiting for it and its QoS 0 backlog is cut
    subscriber_stall_s: float = 0.5
    sys_interval_s: float = 10.0  # $SYS/broker/... publishing period; 0 turns it off
    presence_events: bool = True  # $SYS/brokers/{node}/clients/{client_id}/(dis)connected (presence.py)

    def __post_init__(self) -> None:
        self.write_buffer_low = self.write_buffer_high // 4  # (asyncio's default low mark)
