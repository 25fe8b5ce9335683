"""A client's CONNECT and the connection's end, for an MQTT connection (as Mosquitto's
handle_connect.c): authentication, the will's authorization, session takeover (on this node
and across a cluster), the CONNACK with the server's limits, the session's inflight PUBLISHes
sent again; the client's DISCONNECT, and detaching the session when the connection ends."""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING

from protocols.mqtt.connection import State
from protocols.mqtt.errors import ProtocolViolation
from protocols.mqtt.packets import MQTT_5, ConnAck, Connect, Disconnect
from protocols.mqtt.properties import Properties
from protocols.mqtt.reason_codes import ReasonCode
from protocols.mqtt.topics import TopicError, validate_topic_name
from store import StoredMessage, StoreError

from .presence import CLIENT_DISCONNECT
from .session import NEVER_EXPIRES, Session

if TYPE_CHECKING:
    from .connection import MQTTConnection

log = logging.getLogger("tidemq.mqtt")


async def connect(connection: MQTTConnection, packet: Connect) -> None:
    """Handle the CONNECT (the connection's reading paused meanwhile), then resend what the
    session had in flight and read on."""
    try:
        accepted = await accept(connection, packet)
    except Exception as exc:
        accepted = False
        reason = "the gateway could not set up the session"
        if isinstance(exc, StoreError):  # (a full disk: 3.1.1's CONNACK says 0x03 server unavailable)
            connection.broker.limited_log.log(logging.WARNING, type(exc).__name__, "CONNECT refused client_id=%s error=%s",
                                              packet.client_id, exc)
            reason = f"the session could not be stored: {exc}"
        else:
            log.exception("CONNECT failed client_id=%s", packet.client_id)
        if connection.conn.state is State.CONNECTED:  # it failed after its CONNACK: no second one
            connection.disconnect(ReasonCode.UNSPECIFIED_ERROR, reason)
        elif not connection.closed:
            props = Properties(reason_string=reason[:200]) if connection.conn.version == MQTT_5 else Properties()
            connection.send_packet(ConnAck(False, ReasonCode.UNSPECIFIED_ERROR, props))
            connection.close()
    resend: dict[int, StoredMessage | None] = {}
    session = connection.session
    # what the session had (a new or clean one has nothing: an idle client gets no Delivery)
    had = session is not None and bool(session.inflight or session.cursors or session.subscriptions)
    if accepted and had and not connection.closed:
        try:
            resend = await connection.delivery.inflight_messages()  # (still connecting: its cursors wait meanwhile)
        except StoreError as exc:  # not known whether they are gone: the session keeps them
            log.warning("inflight messages not read client_id=%s error=%s", connection.client_id, exc)
            connection.disconnect(ReasonCode.UNSPECIFIED_ERROR, "the gateway could not read the session's messages")
    connection.connecting = False
    if not accepted or connection.closed:
        return
    connection.read_pauses.resume("connect")
    if had:
        connection.delivery.resend_inflight(resend)
        connection.delivery.pusher.pump()
    connection.process()  # packets that arrived behind the CONNECT (and the CONNACK, written)


def disconnect_received(connection: MQTTConnection, packet: Disconnect) -> None:
    """The client's DISCONNECT: a 5.0 one may change the session's expiry, and keep the will."""
    session = connection.session
    assert session is not None
    expiry = packet.properties.session_expiry_interval
    if expiry is not None:
        if session.expiry_interval == 0 and expiry != 0:
            raise ProtocolViolation("session expiry set at DISCONNECT after 0 at CONNECT")
        session.expiry_interval = expiry
    if packet.reason_code != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE:
        connection.will = None
    connection.ended = (CLIENT_DISCONNECT, int(packet.reason_code))
    connection.close()


async def accept(connection: MQTTConnection, packet: Connect) -> bool:
    """Authenticate, authorize the will, take the session over (from another connection or
    node), answer CONNACK; False when refused (the connection is closed then)."""
    broker = connection.broker
    version = connection.conn.version
    props = packet.properties
    refuse = None
    client_id = packet.client_id
    assigned = None
    if not client_id:
        if not packet.clean_start and version != MQTT_5:
            refuse = ReasonCode.CLIENT_IDENTIFIER_NOT_VALID
        client_id = assigned = f"tidemq-{uuid.uuid4().hex[:20]}"
    if props.authentication_method is not None:
        refuse = ReasonCode.BAD_AUTHENTICATION_METHOD  # no enhanced authentication methods
    if refuse is None:
        refuse = await authenticate(connection, packet, client_id)
    if refuse is None and packet.will is not None:
        try:
            validate_topic_name(packet.will.topic)
        except TopicError:
            refuse = ReasonCode.TOPIC_NAME_INVALID
        else:
            acl = broker.acl
            if packet.will.topic.startswith("$") or (acl is not None and not acl.allows_publish(
                    packet.username, client_id, packet.will.topic)):
                refuse = ReasonCode.NOT_AUTHORIZED
    if connection.closed:
        return False
    if refuse is not None:
        log.info("connection refused client_id=%s peer=%s reason=0x%02X", client_id, connection.peer, refuse)
        connection.send_packet(ConnAck(False, refuse))
        connection.close()
        return False
    connection.client_id = client_id
    connection.username = packet.username
    unavailable = broker.stored_sessions.unavailable()
    if unavailable is not None:
        log.info("connection refused client_id=%s error=%s", client_id, unavailable)
        connection.send_packet(ConnAck(False, ReasonCode.SERVER_UNAVAILABLE))
        connection.close()
        return False
    take_over(connection, client_id)  # the old connection on this node writes the session back
    # disconnected on any other node of a cluster, its session saved there, then loaded here
    await broker.claim_session(client_id)
    if connection.closed:
        return False
    take_over(connection, client_id)  # (one that came meanwhile: the newest connection wins)
    broker.cancel_will(client_id)
    expiry = (props.session_expiry_interval or 0) if version == MQTT_5 else (
        0 if packet.clean_start else NEVER_EXPIRES)
    session = broker.sessions.get(client_id)
    session_present = False
    if session is not None and (packet.clean_start or session.expired()):
        broker.end_session(session)
        session = None
    if session is None:
        session = Session(client_id, version, expiry)
        broker.sessions[client_id] = session
    else:
        session_present = True
        session.version = version
        session.expiry_interval = expiry
    session.disconnected_at = None
    connection.session = session
    acl = broker.acl
    # (a resumed session's subscriptions were allowed under the ACL of their time: each is asked again)
    if acl is not None and acl.checks_deliveries(
            connection.username, client_id, [state.topic_filter for state in session.subscriptions.values()]):
        connection.read_check = acl.allows_read
    broker.connections[client_id] = connection
    connection.will = packet.will
    connection.conn.accepted(packet)  # the limits the client asked for apply from now on
    connection.keep_alive = packet.keep_alive
    connack_props = Properties()
    if version == MQTT_5:
        connack_props.receive_maximum = connection.settings.receive_maximum
        connack_props.maximum_packet_size = connection.settings.max_packet_size
        connack_props.topic_alias_maximum = connection.settings.topic_alias_maximum
        if not broker.shared_refusal.available:
            connack_props.shared_subscription_available = 0  # (SUBACK would say 0x9E)
        if assigned is not None:
            connack_props.assigned_client_identifier = assigned
        if props.request_response_information == 1:
            # the basis of response topics this client may use (MQTT 5.0 section 4.10)
            connack_props.response_information = f"response/{client_id}"
        cap = connection.settings.max_keepalive
        if cap and (connection.keep_alive == 0 or connection.keep_alive > cap):
            connection.keep_alive = cap
            connack_props.server_keep_alive = cap
    connection.restart_keep_alive()
    connection.send_packet(ConnAck(session_present, ReasonCode.SUCCESS, connack_props))
    broker.presence.connected(connection, clean_start=packet.clean_start, session_present=session_present,
                              expiry_interval=expiry)
    for queue in session.queues_read():
        broker.add_reader(queue, connection.delivery.pusher)
    for key, state in session.subscriptions.items():
        if state.share_group is not None:
            broker.join_share(key, connection)
    # Neither the CONNACK nor what follows waits for this write: it commits the client to nothing
    # a crash could contradict (the session reported is the stored one, or a new one a crash
    # leaves absent), so on a full disk a persistent session still reads what is stored.
    broker.mark_dirty(session, holds_output=False)
    log.debug("client connected client_id=%s peer=%s version=%d", client_id, connection.peer, version)
    return True


def take_over(connection: MQTTConnection, client_id: str) -> None:
    """The newest connection of a client id wins: the one before it on this node is disconnected."""
    old = connection.broker.connections.get(client_id)
    if old is not None and old is not connection:
        log.info("session taken over client_id=%s old_peer=%s new_peer=%s", client_id, old.peer, connection.peer)
        old.disconnect(ReasonCode.SESSION_TAKEN_OVER, "another connection uses this client id")


async def authenticate(connection: MQTTConnection, packet: Connect, client_id: str) -> ReasonCode | None:
    auth = connection.broker.authenticator
    if packet.username is None and packet.password is None:
        if connection.settings.allow_anonymous:
            return None
        connection.broker.stats.auth_failures += 1
        return ReasonCode.NOT_AUTHORIZED
    if auth is None:
        return None if connection.settings.allow_anonymous else ReasonCode.BAD_USER_NAME_OR_PASSWORD
    ok = await auth.verify_async(packet.username or "", packet.password or b"")
    if not ok:
        connection.broker.stats.auth_failures += 1
    return None if ok else ReasonCode.BAD_USER_NAME_OR_PASSWORD


def detach(connection: MQTTConnection) -> None:
    """The connection ended: the session is saved (or ended), the will published or scheduled."""
    session = connection.session
    if session is None:
        return
    connection.session = None
    broker = connection.broker
    if broker.connections.get(connection.client_id) is not connection:
        broker.presence.disconnected(connection, will=False)
        return  # taken over: the session belongs to the new connection now
    del broker.connections[connection.client_id]
    for queue in session.queues_read():
        broker.remove_reader(queue, connection.delivery.pusher)
    for key, state in list(session.subscriptions.items()):
        if state.share_group is not None:
            broker.leave_share(key, connection, connection.delivery.take_shared_inflight(key, session))
    session.disconnected_at = time.time()
    will, connection.will = connection.will, None
    broker.presence.disconnected(connection, will=will is not None)  # (stored ahead of the will)
    if session.expiry_interval == 0:
        try:
            broker.end_session(session)
        except StoreError as exc:  # its stored state stays: the expiry sweep ends it later
            log.warning("ended session not deleted client_id=%s error=%s", connection.client_id, exc)
    else:
        broker.mark_dirty(session)
    broker.flush_sessions()  # written now: another node of a cluster may load it next
    broker.stored_sessions.client_gone(connection.client_id)
    if will is not None:
        delay = will.properties.will_delay_interval or 0 if connection.conn.version == MQTT_5 else 0
        if session.expiry_interval == 0 or delay == 0:
            broker.publish_will(connection.client_id, will)
        else:
            broker.schedule_will(session, will, min(delay, session.expiry_interval))
