"""A replication group of real processes on 127.0.0.1 for the chaos script: etcd, three
``--role store`` nodes and a ``--role gateway`` node, each node's stderr appended to a log file,
and the faults the script injects into it (kill -9, SIGSTOP, SIGTERM, restarts)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.crash_support import free_port, kill9, launch, stop
from tests.etcd_support import EtcdServer

HOST = "127.0.0.1"
GROUP = "g1"
NODES = ("s1", "s2", "s3")
FAULTS = ("leader_kill9", "leader_sigstop", "follower_kill9", "restart_all")
LEASE_S = 2.0  # replication_lease_s's default
RECOVERY_S = 60.0


# -- the processes -----------------------------------------------------------------------------
@dataclass
class StoreNode:
    name: str
    args: list[str]
    amqp_port: int
    remoting_port: int
    proc: subprocess.Popen | None = None


@dataclass
class Group:
    """etcd, the three store nodes and a gateway node; nodes keep their ports and data dirs
    across restarts."""

    workdir: Path
    log_dir: Path
    flush: str
    etcd: EtcdServer = field(init=False)
    nodes: dict[str, StoreNode] = field(init=False)
    gateway: subprocess.Popen | None = None
    mqtt_port: int = 0
    amqp_port: int = 0

    def __post_init__(self) -> None:
        self.etcd = EtcdServer(self.workdir / "etcd")
        self.nodes = {}
        for name in NODES:
            amqp, remoting = free_port(), free_port()
            args = ["--role", "store", "--node-id", name, "--replication-group", GROUP, "--etcd", "",
                    "--replication-bind", f"{HOST}:{free_port()}", "--remoting-bind", f"{HOST}:{remoting}",
                    "--amqp-bind", f"{HOST}:{amqp}", "--metrics-bind", f"{HOST}:{free_port()}",
                    "--data-dir", str(self.workdir / name), "--flush", self.flush]
            self.nodes[name] = StoreNode(name, args, amqp, remoting)

    def start(self, with_gateway: bool = True) -> None:
        self.etcd.start()
        for node in self.nodes.values():
            node.args[node.args.index("--etcd") + 1] = self.etcd.endpoint
        self.start_nodes(list(self.nodes))
        if with_gateway:
            self.mqtt_port, self.amqp_port = free_port(), free_port()
            self.gateway = launch(["--role", "gateway", "--node-id", "gw1", "--replication-group", GROUP,
                                   "--etcd", self.etcd.endpoint, "--mqtt-bind", f"{HOST}:{self.mqtt_port}",
                                   "--amqp-bind", f"{HOST}:{self.amqp_port}", "--metrics-bind",
                                   f"{HOST}:{free_port()}", "--data-dir", str(self.workdir / "gw1"),
                                   "--flush", self.flush], name="gw1", log=self.log_dir / "gw1.log")

    @property
    def name_servers(self) -> list[str]:
        """Every store node's remoting address: whichever leads answers RocketMQ clients."""
        return [f"{HOST}:{node.remoting_port}" for node in self.nodes.values()]

    def start_nodes(self, names: list[str]) -> None:
        """Start these store nodes together; each returns once it joined the group."""
        def one(name: str) -> None:
            node = self.nodes[name]
            with open(self.log_dir / f"{name}.log", "a") as log:
                log.write(f"=== chaos: start at {time.strftime('%H:%M:%S')}\n")
            node.proc = launch(node.args, name=name, ready="joined its replication group",
                               log=self.log_dir / f"{name}.log")

        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(one, names))

    def stop_nodes(self, names: list[str]) -> None:
        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(lambda name: stop(self.nodes[name].proc), names))

    def close(self) -> None:
        if self.gateway is not None:
            stop(self.gateway)
        for node in self.nodes.values():
            if node.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.proc.pid, signal.SIGCONT)
                stop(node.proc)
        self.etcd.stop()

    async def leader(self) -> dict | None:
        with contextlib.suppress(Exception):
            return await self.etcd.leader(GROUP)
        return None

    async def wait_leader(self, not_node: str | None = None, timeout_s: float = RECOVERY_S) -> dict | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = await self.leader()
            if leader is not None and leader["node"] != not_node:
                return leader
            await asyncio.sleep(0.05)
        return None

    async def wait_whole(self, timeout_s: float = RECOVERY_S) -> dict | None:
        """Until a leader leads the newest epoch with both others in sync; its state, or None."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                leader, state = await self.etcd.leader(GROUP), await self.etcd.state(GROUP)
                if (leader is not None and state is not None and state.get("leader") == leader["node"]
                        and state.get("epoch") == leader["epoch"]
                        and set(state.get("in_sync", ())) | {leader["node"]} == set(NODES)):
                    return state
            await asyncio.sleep(0.1)
        return None


# -- the faults --------------------------------------------------------------------------------
async def inject(fault: str, group: Group, rng: random.Random, say, sigstop_s: float = 0.0) -> float:
    """Do ``fault`` and start again what it stopped; returns the moment of the fault.
    ``sigstop_s``: leader_sigstop keeps the leader stopped at least this long."""
    leader = await group.wait_leader()
    if leader is None:
        raise RuntimeError("no leader before the fault")
    name = leader["node"]
    say(f"# fault={fault} leader={name} epoch={leader['epoch']}")
    if fault == "leader_kill9":
        kill9(group.nodes[name].proc)
        at = time.monotonic()
        successor = await group.wait_leader(not_node=name)
        say(f"# leader_kill9: new leader {successor and successor['node']} after {time.monotonic() - at:.2f} s")
        await asyncio.to_thread(group.start_nodes, [name])
        return at
    if fault == "leader_sigstop":
        proc = group.nodes[name].proc
        os.kill(proc.pid, signal.SIGSTOP)
        at = time.monotonic()
        try:
            successor = await group.wait_leader(not_node=name)
            await asyncio.sleep(max(0.0, at + max(1.5 * LEASE_S, sigstop_s) - time.monotonic()))
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        say(f"# leader_sigstop: new leader {successor and successor['node']}, SIGCONT after {time.monotonic() - at:.2f} s")
        return at
    if fault == "follower_kill9":
        follower = rng.choice(sorted(set(NODES) - {name}))
        say(f"# follower_kill9: {follower}")
        kill9(group.nodes[follower].proc)
        at = time.monotonic()
        await asyncio.sleep(1.0)
        await asyncio.to_thread(group.start_nodes, [follower])
        return at
    if fault == "restart_all":
        at = time.monotonic()
        await asyncio.to_thread(group.stop_nodes, list(NODES))
        say(f"# restart_all: stopped in {time.monotonic() - at:.2f} s")
        await asyncio.to_thread(group.start_nodes, list(NODES))
        return at
    raise ValueError(f"unknown fault {fault}")


