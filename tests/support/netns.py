"""Hosts for multi-host tests: network namespaces the test creates, joined by a bridge of their own.

Each host is a namespace with one veth into a "switch" namespace that holds the bridge, so nothing
touches the machine's own interfaces and all traffic stays between namespaces this test made. The
addresses (10.231.X.0/24, a range picked for these tests) exist only inside those namespaces.
Processes are started with `ip netns exec` (which execs, so the PID is the process's own) and
stopped by that PID before the namespaces are deleted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

SUBNET = "10.231.{net}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def cannot_create_namespaces() -> str | None:
    """Why this machine cannot run the multi-host tests, or None when it can."""
    probe = f"rp-probe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except FileNotFoundError:
        return "`ip` (iproute2) is not installed"
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` is not allowed here: {exc.stderr.decode(errors='replace').strip()}"
    _ip("netns", "del", probe)
    return None


@dataclass
class Host:
    name: str  # the namespace
    address: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(
        self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `argv` inside this host; its output goes to `log`."""
        out: IO[bytes] = open(log, "wb")  # noqa: SIM115 - owned by the process's lifetime
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.name, *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        out.close()
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        """Stop what this host runs, by PID: SIGTERM, then SIGKILL after 10 s."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@contextmanager
def hosts(count: int) -> Iterator[list[Host]]:
    """`count` hosts on one bridged network; everything is removed on the way out."""
    tag = uuid.uuid4().hex[:6]
    switch = f"rp-{tag}-sw"
    net = int(tag[:2], 16) % 200 + 20  # a /24 per test run, so runs side by side never collide
    made: list[str] = []
    members: list[Host] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i in range(count):
            name = f"rp-{tag}-h{i}"
            _ip("netns", "add", name)
            made.append(name)
            address = f"{SUBNET.format(net=net)}.{i + 1}"
            _ip(
                "link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", f"p{i}", "netns", switch
            )
            _ip("-n", switch, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", switch, "link", "set", f"p{i}", "up")
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
            members.append(Host(name, address))
        yield members
    finally:
        for host in members:
            host.stop()
        for name in reversed(made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
