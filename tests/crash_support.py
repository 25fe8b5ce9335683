"""Gateway processes for crash tests: a free 127.0.0.1 port, a real ``python -m gateway serve``
started on a data dir with only the listeners a test asks for, ``kill -9`` and a graceful stop,
and the seeded random source that picks the kill moments.
One place for these, shared by every protocol's crash test (and the cluster process tests)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .ports import free_port  # noqa: F401 (the tests import it from here)

ROOT = Path(__file__).resolve().parent.parent
START_S = 30.0


# the listeners on by default, at fixed ports (gateway/config.py); ARGS given after these win
DEFAULT_LISTENERS_OFF = ("--mqtt-bind", "", "--amqp-bind", "", "--remoting-bind", "")
# every process ``launch`` started during the current test (conftest.py stops those left running)
LAUNCHED: list[subprocess.Popen] = []


def launch(args: list[str], *, env: dict[str, str] | None = None, name: str = "gateway",
           ready: str = "gateway ready", log: Path | None = None) -> subprocess.Popen:
    """Start ``python -m gateway serve ARGS`` from this checkout and return once it logged
    ``ready``; its stderr is drained from then on so that it never blocks on a full pipe
    (appended to ``log`` when given, the lines before ``ready`` included). A listener runs only
    where ARGS give its address: the defaults' fixed ports are never a test's (two runs at once
    would fight over them)."""
    sink = open(log, "a", buffering=1) if log is not None else None  # noqa: SIM115 (closed by the drain)
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", *DEFAULT_LISTENERS_OFF, *args], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {})})
    LAUNCHED.append(proc)
    deadline = time.monotonic() + START_S
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        lines.append(line)
        if sink is not None:
            sink.write(line)
        if ready in line:
            threading.Thread(target=_drain, args=(proc, sink), daemon=True).start()
            return proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    proc.wait()
    if sink is not None:
        sink.close()
    said = [line for line in lines if line][-10:]  # (at its end, readline gives "" until the process is reaped)
    raise AssertionError(f"{name} did not start (exit code {proc.returncode}): {''.join(said)}")


def _drain(proc: subprocess.Popen, sink) -> None:
    """Read the process's stderr to its end, into ``sink`` when there is one."""
    if sink is None:
        proc.stderr.read()  # type: ignore[union-attr]
        return
    with sink:
        for line in proc.stderr:  # type: ignore[union-attr]
            sink.write(line)


def start_gateway(data_dir: Path, *, mqtt_port: int | None = None, amqp_port: int | None = None,
                  remoting_port: int | None = None, flush: str = "sync",
                  env: dict[str, str] | None = None) -> subprocess.Popen:
    """A standalone gateway on ``data_dir``; a listener runs only when its port is given."""
    def bind(port: int | None) -> str:
        return "" if port is None else f"127.0.0.1:{port}"

    return launch(["--data-dir", str(data_dir), "--mqtt-bind", bind(mqtt_port), "--amqp-bind", bind(amqp_port),
                   "--remoting-bind", bind(remoting_port), "--flush", flush], env=env)


def seeded_random(test: str) -> random.Random:
    """The random source of a crash test: seeded from ``CRASH_SEED`` when set (to replay
    a failure), else at random; the seed is printed, so a failing run shows it."""
    seed = int(os.environ.get("CRASH_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"{test}: CRASH_SEED={seed}")
    return random.Random(seed)


def kill9(proc: subprocess.Popen) -> None:
    """SIGKILL: no shutdown code runs, as in a power cut of the process."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM and wait; SIGKILL if the graceful stop hangs (a test's cleanup must not)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
