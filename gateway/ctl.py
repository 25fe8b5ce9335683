"""``tidemq ctl``: the admin API of a running gateway (its ``--metrics-bind`` listener) from
the command line -- clients, sessions, subscriptions, queues, kicking a client, and finding a
message by key or message id, and a message's trace. Plain HTTP with the standard library; tables or ``--json``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEFAULT_URL = "http://127.0.0.1:9100"
TIMEOUT_S = 10.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    ctl = sub.add_parser("ctl", help="inspect and manage a running gateway (its --metrics-bind listener)")
    ctl.add_argument("--url", default=os.environ.get("TIDEMQ_ADMIN_URL", DEFAULT_URL),
                     help=f"the gateway's metrics/admin listener (default $TIDEMQ_ADMIN_URL or {DEFAULT_URL})")
    ctl.add_argument("--token", default=os.environ.get("TIDEMQ_ADMIN_TOKEN", ""),
                     help="the gateway's admin_token, if it has one (default $TIDEMQ_ADMIN_TOKEN)")
    ctl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    what = ctl.add_subparsers(dest="what", metavar="WHAT", required=True)
    clients = what.add_parser("clients", help="connected clients of every protocol")
    clients.add_argument("--id", help="where this MQTT client is connected (in a cluster: which node)")
    what.add_parser("sessions", help="MQTT sessions (connected and persistent)")
    what.add_parser("subscriptions", help="MQTT subscriptions, AMQP consumers, remoting group subscriptions")
    queues = what.add_parser("queues", help="store queues: offsets, entries stored, backlog, readers")
    queues.add_argument("--prefix", default="", help="only queues whose name starts so (t: w: q: r: sched:); "
                        "those of $ topics (presence events) are listed only with a prefix that names them (t:$)")
    queues.add_argument("--limit", type=int, default=100, help="queues per page (1 to 1000; default 100)")
    queues.add_argument("--after", default="", help="start after this queue (a cut listing says where it stopped)")
    kick = what.add_parser("kick", help="disconnect a client")
    kick.add_argument("protocol", choices=("mqtt", "amqp", "remoting"))
    kick.add_argument("client", help="MQTT client id, AMQP peer HOST:PORT, remoting client id or peer")
    query = what.add_parser("query", help="find messages by key (and topic) or by message id")
    query.add_argument("--key")
    query.add_argument("--topic", help="the topic the key was stored under")
    query.add_argument("--msg-id")
    trace = what.add_parser("trace", help="the trace of a message (publish, store, deliver, ack) by id or key")
    trace.add_argument("--msg-id")
    trace.add_argument("--key", help="a key the message was published with")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except BrokenPipeError:
        # the reader went away (`tidemq ctl queues | head -1`): end as a tool SIGPIPE killed,
        # quietly; stdout goes to /dev/null so that the interpreter's last flush fails no more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _run(args: argparse.Namespace) -> int:
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
            params = {"msg_id": args.msg_id} if args.msg_id else {"key": args.key, "topic": args.topic}
            data = _call(args, "GET", "/admin/messages?" + urllib.parse.urlencode(params))
        elif args.what == "clients" and args.id:
            data = _call(args, "GET", "/admin/clients?" + urllib.parse.urlencode({"id": args.id}))
        elif args.what == "trace":
            if not args.msg_id and not args.key:
                print("tidemq ctl trace: give --msg-id or --key", file=sys.stderr)
                return 2
            params = {"msg_id": args.msg_id} if args.msg_id else {"key": args.key}
            data = _call(args, "GET", "/admin/trace?" + urllib.parse.urlencode(params))["events"]
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
            print(f"tidemq ctl trace: no trace events of a message with {what}", file=sys.stderr)
        elif args.msg_id:
            print(f"tidemq ctl query: no message with id {args.msg_id}", file=sys.stderr)
        else:
            print(f"tidemq ctl query: no message with key {args.key!r} in topic {args.topic!r}", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=2) if args.json or not isinstance(data, list) else table(data))
    sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
    if next_after is not None:
        print(f"tidemq ctl queues: the listing was cut after {len(data)} queues; "
              f"go on with --after {next_after!r}", file=sys.stderr)
    return 0


class CtlError(Exception):
    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status  # the admin API's HTTP status, 0 when it was not reached


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(args.url.rstrip("/") + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    if args.token:
        request.add_header("Authorization", f"Bearer {args.token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        raise CtlError(f"{exc.code}: {message}", exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CtlError(f"cannot reach {args.url} ({reason}); is the gateway running with --metrics-bind?") from None


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)"
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(column), *(len(r[i]) for r in cells)) for i, column in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        text = json.dumps(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return str(value)
