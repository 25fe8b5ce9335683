"""``tidemq ctl``: the admin API of a running gateway (its ``--metrics-bind`` listener) from
the command line -- clients, sessions, subscriptions, queues, kicking a client, finding a
message by key or message id, a message's trace, the event rules and schemas. Plain HTTP with the
standard library; tables or ``--json``; the admin token or an admin user's name and password as credentials."""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import signal
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any

DEFAULT_URL = "http://127.0.0.1:9100"
TIMEOUT_S = 10.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    ctl = sub.add_parser("ctl", help="inspect and manage a running gateway (its --metrics-bind listener)")
    _add_common_options(ctl, defaults=True)
    after = argparse.ArgumentParser(add_help=False)  # `tidemq ctl clients --json` as `ctl --json clients`
    _add_common_options(after, defaults=False)
    what = ctl.add_subparsers(dest="what", metavar="WHAT", required=True)
    clients = what.add_parser("clients", parents=[after], help="connected clients of every protocol")
    clients.add_argument("--id", help="where this MQTT client is connected (in a cluster: which node)")
    what.add_parser("sessions", parents=[after], help="MQTT sessions (connected and persistent)")
    what.add_parser("cluster", parents=[after],
                    help="the replicated store group: roles, epoch, in-sync set, each follower's lag")
    what.add_parser("subscriptions", parents=[after],
                    help="MQTT subscriptions, AMQP consumers, remoting group subscriptions")
    queues = what.add_parser("queues", parents=[after],
                             help="store queues: offsets, entries stored, backlog, readers")
    queues.add_argument("--prefix", default="", help="only queues whose name starts so (t: w: q: r: sched:); "
                        "those of $ topics (presence events) are listed only with a prefix that names them (t:$)")
    queues.add_argument("--limit", type=int, default=100, help="queues per page (1 to 1000; default 100)")
    queues.add_argument("--after", default="", help="start after this queue (a cut listing says where it stopped)")
    kick = what.add_parser("kick", parents=[after], help="disconnect a client")
    kick.add_argument("protocol", choices=("mqtt", "amqp", "remoting"))
    kick.add_argument("client", help="MQTT client id, AMQP peer HOST:PORT, remoting client id or peer")
    query = what.add_parser("query", parents=[after],
                            help="find messages by key (and topic) or by message id (the store's or the client's)")
    query.add_argument("--key")
    query.add_argument("--topic", help="the topic the key (or a client's msgId) was stored under")
    query.add_argument("--msg-id", help="the store's offsetMsgId, or the msgId a RocketMQ client printed")
    trace = what.add_parser("trace", parents=[after],
                            help="the trace of a message (publish, store, deliver, ack) by id or key")
    trace.add_argument("--msg-id", help="the store's offsetMsgId, or the msgId a RocketMQ client printed")
    trace.add_argument("--key", help="a key the message was published with")
    rules = what.add_parser("rules", parents=[after],
                            help="event rules: list (state, matched, delivered, retried, dead_lettered, lag, "
                                 "target latency), show, create, change, pause, resume, replay, delete")
    rules.add_argument("action", nargs="?", default="list",
                       choices=("list", "show", "create", "change", "pause", "resume", "replay", "delete"))
    rules.add_argument("name", nargs="?", help="the rule (every action but list)")
    rules.add_argument("--file", help="create, change: the rule's definition, a JSON file (- : standard input); "
                                      "see docs/rules.md")
    rules.add_argument("--from", dest="from_time", metavar="TIME",
                       help="replay: from the first message stored at or after TIME (RFC 3339, such as "
                            "2026-11-29T10:00:00Z)")
    rules.add_argument("--offset", type=int, help="replay: from this offset of the rule's source queue (a rule of "
                                                  "one source)")
    schemas = what.add_parser("schemas", parents=[after],
                              help="event schemas (JSON Schema per event type): list, show, put, delete")
    schemas.add_argument("action", nargs="?", default="list", choices=("list", "show", "put", "delete"))
    schemas.add_argument("name", nargs="?", help="the schema's name, an event type (every action but list)")
    schemas.add_argument("--file", help="put: the JSON Schema, a JSON file (- : standard input)")
    schemas.add_argument("--version", type=int, help="show: this version (default: the current one)")


def _add_common_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """Where the gateway is, the credentials and the output form: given before or after WHAT
    (after it they take no default, so as not to undo one given before)."""
    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    env = os.environ.get
    parser.add_argument("--url", default=default(env("TIDEMQ_ADMIN_URL", DEFAULT_URL)),
                        help=f"the gateway's metrics/admin listener (default $TIDEMQ_ADMIN_URL or {DEFAULT_URL})")
    parser.add_argument("--token", default=default(env("TIDEMQ_ADMIN_TOKEN", "")),
                        help="the gateway's admin_token (default $TIDEMQ_ADMIN_TOKEN)")
    parser.add_argument("--user", default=default(env("TIDEMQ_ADMIN_USER", "")),
                        help="a user of the gateway's admin_users (default $TIDEMQ_ADMIN_USER)")
    parser.add_argument("--password", default=default(env("TIDEMQ_ADMIN_PASSWORD", "")),
                        help="that user's password (default $TIDEMQ_ADMIN_PASSWORD; asked for when not given)")
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except BrokenPipeError:
        # the reader went away (`tidemq ctl queues | head -1`): end as a tool SIGPIPE killed,
        # quietly; stdout goes to /dev/null so that the interpreter's last flush fails no more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _run(args: argparse.Namespace) -> int:
    tracing: list[str] = []
    next_after = None  # (queues) where a cut listing goes on
    try:
        if args.what == "kick":
            data = _call(args, "POST", "/admin/kick", {"protocol": args.protocol, "client": args.client})
        elif args.what == "queues":
            page = _call(args, "GET", "/admin/queues?" + urllib.parse.urlencode(
                {"prefix": args.prefix, "after": args.after, "limit": args.limit}))
            data, next_after = page["queues"], page["next_after"]
        elif args.what == "query":
            if not args.msg_id and not (args.key and args.topic):
                print("tidemq ctl query: give --msg-id, or --key and --topic", file=sys.stderr)
                return 2
            params = {"msg_id": args.msg_id} if args.msg_id else {"key": args.key}
            if args.topic:
                params["topic"] = args.topic
            data = _call(args, "GET", "/admin/messages?" + urllib.parse.urlencode(params))
        elif args.what == "rules":
            data = _rules(args)
        elif args.what == "schemas":
            data = _schemas(args)
        elif args.what == "clients" and args.id:
            data = _call(args, "GET", "/admin/clients?" + urllib.parse.urlencode({"id": args.id}))
        elif args.what == "trace":
            if not args.msg_id and not args.key:
                print("tidemq ctl trace: give --msg-id or --key", file=sys.stderr)
                return 2
            params = {"msg_id": args.msg_id} if args.msg_id else {"key": args.key}
            answer = _call(args, "GET", "/admin/trace?" + urllib.parse.urlencode(params))
            data, tracing = answer["events"], answer["tracing"]
        else:
            data = _call(args, "GET", f"/admin/{args.what}")
    except CtlError as exc:
        print(f"tidemq ctl: {exc}", file=sys.stderr)
        return 2 if exc.status == 400 else 1  # 400: the arguments (a malformed message id)
    if args.what in ("query", "trace") and not data:  # as grep: nothing found is exit status 1
        if args.json:
            print(json.dumps(data))
        if args.what == "trace":
            what = f"id {args.msg_id}" if args.msg_id else f"key {args.key!r}"
            print(f"tidemq ctl trace: no trace events of a message with {what}"
                  + (f" (traced listeners: {', '.join(tracing)})" if tracing else TRACE_OFF), file=sys.stderr)
        elif args.msg_id:
            print(f"tidemq ctl query: no message with id {args.msg_id}", file=sys.stderr)
        else:
            print(f"tidemq ctl query: no message with key {args.key!r} in topic {args.topic!r}", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=2) if args.json else table(data if isinstance(data, list) else [data]))
    sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
    if next_after is not None:
        print(f"tidemq ctl queues: the listing was cut after {len(data)} queues; "
              f"go on with --after {next_after!r}", file=sys.stderr)
    return 0


RULE_COLUMNS = ("name", "state", "sources", "targets", "matched", "delivered", "retried", "dead_lettered", "lag",
                "target_latency_ms", "last_error")


def _rules(args: argparse.Namespace) -> Any:
    """The rules call of ``tidemq ctl rules ACTION [NAME]``: its rows (list) or the rule's row."""
    if args.action == "list":
        rows = _call(args, "GET", "/admin/rules")
        return rows if args.json else [{k: row[k] for k in RULE_COLUMNS} for row in rows]
    if not args.name:
        raise CtlError(f"rules {args.action}: give the rule's name", 400)
    path = "/admin/rules/" + urllib.parse.quote(args.name, safe="")
    if args.action in ("create", "change"):
        if not args.file:
            raise CtlError(f"rules {args.action}: give the definition with --file FILE.json", 400)
        try:
            text = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8").read()
            definition = json.loads(text)
        except (OSError, ValueError) as exc:
            raise CtlError(f"rules {args.action}: cannot read the definition in {args.file}: {exc}", 400) from None
        if not isinstance(definition, dict):
            raise CtlError(f"rules {args.action}: the definition in {args.file} is not a JSON object", 400)
        if args.action == "create":
            return _call(args, "POST", "/admin/rules", {**definition, "name": args.name})
        return _call(args, "PUT", path, definition)
    if args.action == "replay":
        if (args.from_time is None) == (args.offset is None):
            raise CtlError("rules replay: give --from TIME or --offset N", 400)
        point = {"from": args.from_time} if args.from_time is not None else {"offset": args.offset}
        row = _call(args, "POST", f"{path}/replay", point)
        return row if args.json else {k: row[k] for k in (*RULE_COLUMNS, "replayed_from")}
    if args.action == "show":
        return _call(args, "GET", path)
    if args.action == "delete":
        return _call(args, "DELETE", path)
    return _call(args, "POST", f"{path}/{args.action}")


def _schemas(args: argparse.Namespace) -> Any:
    """The call of ``tidemq ctl schemas ACTION [NAME]``: the list, or one schema."""
    if args.action == "list":
        return _call(args, "GET", "/admin/schemas")
    if not args.name:
        raise CtlError(f"schemas {args.action}: give the schema's name", 400)
    path = "/admin/schemas/" + urllib.parse.quote(args.name, safe="")
    if args.action == "put":
        if not args.file:
            raise CtlError("schemas put: give the JSON Schema with --file FILE.json", 400)
        try:
            schema = json.loads(sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8").read())
        except (OSError, ValueError) as exc:
            raise CtlError(f"schemas put: cannot read the schema in {args.file}: {exc}", 400) from None
        return _call(args, "PUT", path, schema)
    if args.action == "delete":
        return _call(args, "DELETE", path)
    return _call(args, "GET", path + (f"?version={args.version}" if args.version is not None else ""))


TRACE_OFF = (": message trace is off on every listener of this gateway; turn it on with "
             "`tidemq serve --trace mqtt,amqp,remoting` (or all; trace in TOML, TIDEMQ_TRACE)")
CREDENTIALS = ("give the admin token (--token, $TIDEMQ_ADMIN_TOKEN) or the credentials of one of its admin_users "
               "(--user and --password, $TIDEMQ_ADMIN_USER and $TIDEMQ_ADMIN_PASSWORD)")


class CtlError(Exception):
    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status  # the admin API's HTTP status, 0 when it was not reached


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(args.url.rstrip("/") + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    authorization = _authorization(args)
    if authorization:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        if exc.code == 401 and not authorization:
            message = f"{message}; {CREDENTIALS}"
        raise CtlError(f"{exc.code}: {message}", exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CtlError(f"cannot reach {args.url} ({reason}); is the gateway running with --metrics-bind?") from None


def _authorization(args: argparse.Namespace) -> str:
    """The Authorization header of the credentials given ("": none): the token, or a user's."""
    if args.token:
        return f"Bearer {args.token}"
    if not args.user:
        return ""
    password = args.password
    if not password:
        if not sys.stdin.isatty():
            raise CtlError(f"--user {args.user} needs --password or $TIDEMQ_ADMIN_PASSWORD")
        try:
            password = args.password = getpass.getpass(f"password of {args.user}: ")
        except EOFError:  # Ctrl-D at the prompt
            raise CtlError(f"no password given for --user {args.user}") from None
    return "Basic " + base64.b64encode(f"{args.user}:{password}".encode()).decode()


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)"
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[_cell(column, row.get(column)) for column in columns] for row in rows]
    widths = [max(len(column), *(len(r[i]) for r in cells)) for i, column in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


# columns that hold epoch milliseconds: ISO 8601 (UTC) in tables, numbers in JSON
TIME_COLUMNS = frozenset({"time", "born_timestamp", "store_timestamp"})


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "-"
    if column in TIME_COLUMNS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return _iso(value)
    if isinstance(value, (dict, list)):
        text = json.dumps(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return str(value)


def _iso(ms: float) -> str:
    try:
        moment = datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
