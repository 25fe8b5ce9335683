"""``tidemq`` command line: ``tidemq serve [flags]``, ``tidemq passwd``, ``tidemq ctl``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from store import StoreCorruptError, StoreError, StoreLockedError

from . import __version__, ctl
from .auth import AclError, AuthConfigError, PasswordFile
from .config import ConfigError, load_config
from .logs import setup_logging

log = logging.getLogger("tidemq.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidemq", description="TideMQ edge-to-cloud messaging gateway")
    parser.add_argument("--version", action="version", version=f"tidemq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser("serve", help="run the gateway (embedded store, all listeners)")
    serve.add_argument("--config", metavar="FILE", help="TOML configuration file")
    serve.add_argument("--role", choices=("embedded", "store", "gateway"),
                       help="embedded (default): one node; store: also serve the store to gateway nodes "
                            "on the remoting listener; gateway: MQTT over the store node's store (--store), AMQP and "
                            "RocketMQ clients relayed to the store node")
    serve.add_argument("--store", dest="store_address", metavar="HOST:PORT",
                       help="the store node's remoting listener (role gateway)")
    serve.add_argument("--node-id", metavar="ID", help="this gateway node's name in the cluster")
    serve.add_argument("--lookup", dest="lookup_backend", choices=("embedded", "redis"),
                       help="the lookup of a gateway node: embedded (over --peers) or redis (--redis-url)")
    serve.add_argument("--lookup-bind", metavar="HOST:PORT", help="this gateway node's embedded lookup listener")
    serve.add_argument("--peers", metavar="ID=HOST:PORT,...",
                       help="every gateway node's lookup address, this one included (embedded lookup)")
    serve.add_argument("--redis-url", metavar="URL", help="Redis for the lookup (redis://host:port/db)")
    serve.add_argument("--cluster-token", metavar="TOKEN",
                       help="shared secret gateway nodes present to the store node (set on both)")
    serve.add_argument("--replication-group", metavar="NAME",
                       help="a replicated store: store nodes of this group elect their leader in etcd "
                            "(--etcd); gateway nodes follow it (docs/replication.md)")
    serve.add_argument("--etcd", dest="etcd_endpoint", metavar="HOST:PORT", help="etcd's client URL (replication)")
    serve.add_argument("--replication-bind", metavar="HOST:PORT",
                       help="where this store node's followers read its commitlog (replication)")
    serve.add_argument("--data-dir", metavar="DIR", help="where the store keeps its files (default ./data)")
    for proto, default in (("mqtt", "localhost:1883"), ("amqp", "localhost:5672"), ("remoting", "localhost:9876")):
        serve.add_argument(
            f"--{proto}-bind", metavar="HOST:PORT",
            help=f"{proto} listener (default {default}: 127.0.0.1 and ::1; [::1]:PORT for IPv6; empty = off)"
        )
    serve.add_argument("--grpc-bind", metavar="HOST:PORT",
                       help="RocketMQ 5 clients over gRPC (default off; needs the remoting listener, or "
                            "on role gateway the store node's gRPC listener)")
    serve.add_argument("--grpcs-bind", metavar="HOST:PORT",
                       help="RocketMQ 5 clients over gRPC with TLS (--tls-cert, --tls-key; empty = off)")
    serve.add_argument("--metrics-bind", metavar="HOST:PORT", help="metrics/admin listener (empty = off)")
    serve.add_argument("--admin-token", metavar="TOKEN",
                       help="the operator's bearer token on /admin and /data (tidemq ctl --token)")
    serve.add_argument("--admin-users", metavar="USER,...",
                       help="password-file users who are the operator on /admin and /data (HTTP Basic)")
    serve.add_argument("--trace", metavar="LISTENERS",
                       help="trace messages of these listeners: mqtt,mqtts,ws,amqp,remoting or all")
    serve.add_argument("--mqtts-bind", metavar="HOST:PORT", help="MQTT over TLS listener (empty = off)")
    serve.add_argument("--ws-bind", metavar="HOST:PORT", help="MQTT over WebSocket listener (empty = off)")
    serve.add_argument("--tls-cert", metavar="FILE", help="TLS certificate chain (PEM) for --mqtts-bind")
    serve.add_argument("--tls-key", metavar="FILE", help="TLS private key (PEM) for --mqtts-bind")
    serve.add_argument("--allow-anonymous", choices=("true", "false"), help="accept clients without credentials")
    serve.add_argument("--password-file", metavar="FILE", help="user database (see `tidemq passwd`)")
    serve.add_argument("--acl-file", metavar="FILE", help="access control list (Mosquitto acl_file format)")
    serve.add_argument("--access-keys-file", metavar="FILE", help="RocketMQ AccessKeys and SecretKeys (docs/authorization.md)")
    passwd = sub.add_parser("passwd", help="manage a password file (as mosquitto_passwd)")
    passwd.add_argument("-c", dest="create", action="store_true", help="create the file (overwrites it)")
    passwd.add_argument("-b", dest="batch", action="store_true", help="take the password from the command line")
    passwd.add_argument("-D", dest="delete", action="store_true", help="delete the user")
    passwd.add_argument("file", metavar="FILE")
    passwd.add_argument("username", metavar="USERNAME")
    passwd.add_argument("password", metavar="PASSWORD", nargs="?")
    ctl.add_parser(sub)
    serve.add_argument("--flush", choices=("sync", "async"), help="acknowledge after fdatasync, or after write")
    serve.add_argument("--segment-size", type=int, metavar="BYTES", help="commitlog segment size")
    serve.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    serve.add_argument(
        "--repair",
        action="store_true",
        default=None,
        help="truncate a commitlog damaged in the middle at the damage (drops what follows)",
    )
    return parser


def event_loop_factory(choice: str):
    """uvloop when asked or, for "auto", when installed; None: asyncio's own loop (the default:
    docs/benchmarks/ records why)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("tidemq: event_loop = uvloop but uvloop is not installed") from None
        return None
    return uvloop.new_event_loop


def passwd_command(args: argparse.Namespace) -> int:
    """``tidemq passwd [-c] [-b] [-D] FILE USERNAME [PASSWORD]``, as mosquitto_passwd."""
    import getpass

    path = Path(args.file)
    try:
        users = PasswordFile() if args.create else PasswordFile.load(path)
    except AuthConfigError as exc:
        print(f"tidemq passwd: {exc} (use -c to create a new file)", file=sys.stderr)
        return 2
    if args.delete:
        if not users.delete(args.username):
            print(f"tidemq passwd: user {args.username!r} is not in {path}", file=sys.stderr)
            return 2
    else:
        password = args.password
        if args.batch:
            if password is None:
                print("tidemq passwd: -b needs the password on the command line", file=sys.stderr)
                return 2
        elif password is not None:
            print("tidemq passwd: give the password on the command line only with -b", file=sys.stderr)
            return 2
        else:
            if not sys.stdin.isatty():
                print("tidemq passwd: no terminal to ask for the password; use -b", file=sys.stderr)
                return 2
            password = getpass.getpass("Password: ")
            if password != getpass.getpass("Reenter password: "):
                print("tidemq passwd: the passwords do not match", file=sys.stderr)
                return 2
        try:
            users.set(args.username, password)
        except ValueError as exc:
            print(f"tidemq passwd: {exc}", file=sys.stderr)
            return 2
    try:
        users.save(path)
    except OSError as exc:
        print(f"tidemq passwd: cannot write {path}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "passwd":
        return passwd_command(args)
    if args.command == "ctl":
        return ctl.run(args)
    if args.command != "serve":
        parser.print_help()
        return 2
    overrides = {
        "role": args.role,
        "store_address": args.store_address,
        "node_id": args.node_id,
        "cluster_token": args.cluster_token,
        "lookup_backend": args.lookup_backend,
        "lookup_bind": args.lookup_bind,
        "peers": args.peers,
        "redis_url": args.redis_url,
        "replication_group": args.replication_group,
        "etcd_endpoint": args.etcd_endpoint,
        "replication_bind": args.replication_bind,
        "data_dir": args.data_dir,
        "mqtt_bind": args.mqtt_bind,
        "amqp_bind": args.amqp_bind,
        "remoting_bind": args.remoting_bind,
        "grpc_bind": args.grpc_bind,
        "grpcs_bind": args.grpcs_bind,
        "metrics_bind": args.metrics_bind,
        "admin_token": args.admin_token,
        "admin_users": args.admin_users,
        "trace": args.trace,
        "mqtts_bind": args.mqtts_bind,
        "ws_bind": args.ws_bind,
        "tls_cert_file": args.tls_cert,
        "tls_key_file": args.tls_key,
        "allow_anonymous": args.allow_anonymous,
        "password_file": args.password_file,
        "acl_file": args.acl_file,
        "access_keys_file": args.access_keys_file,
        "flush": args.flush,
        "segment_size": args.segment_size,
        "log_level": args.log_level,
        "repair": args.repair,
    }
    try:
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"tidemq: configuration error: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    from .server import serve

    try:
        with asyncio.Runner(loop_factory=event_loop_factory(config.event_loop)) as runner:
            runner.run(serve(config))
    except StoreCorruptError as exc:
        print(f"tidemq: {exc}", file=sys.stderr)
        return 3
    except (AuthConfigError, AclError, ConfigError) as exc:
        print(f"tidemq: configuration error: {exc}", file=sys.stderr)
        return 2
    except StoreLockedError as exc:
        print(f"tidemq: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"tidemq: store error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print(f"tidemq: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
