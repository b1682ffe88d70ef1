"""Test hosts of the project's own: Linux network namespaces joined to one switch.

Each host is a network namespace with one veth link to a switch, itself a namespace holding
a bridge; addresses live only on those links (a private /24, 10.231.X.0/24), and the test
process reaches the hosts through one more link of its own (the observer's, in the root
namespace, which faults never touch). A fault is made at the switch, the way a network
makes it: iptables in the switch's namespace (bridged packets pass its FORWARD chain)

- cuts a host, or two hosts from each other, by dropping their packets without a word: no
  reset, no ICMP, the links stay up (what a partition or a dead switch port does);
- degrades every link: each packet forwarded is dropped with a probability (the kernel's
  `statistic` match) and the rest held for a fixed time (`delay.py`, on NFQUEUE: this
  machine's kernel has no `netem`).

Everything is made by the tests and removed by them: names carry the creating process's id,
so namespaces a killed run left behind are found and removed by the next run.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from trialq.lifeline import die_with_parent

PREFIX = "tqh"
"""Every namespace and link these tests make starts with it, then the creator's pid in hex."""
SUBNET = "10.231.{}.0/24"
OBSERVER_OCTET = 254
DELAY_QUEUE = 7
COMMAND_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0
NEEDED_TOOLS = ("ip", "iptables", "unshare")


def unavailable() -> str | None:
    """Why namespaced hosts cannot be made here, or None when they can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    missing = [tool for tool in NEEDED_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)}"
    probe = f"{PREFIX}{os.getpid():x}-probe{uuid.uuid4().hex[:4]}"
    try:
        _run("ip", "netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` fails here: {exc.stderr.strip()}"
    try:
        _run("ip", "netns", "exec", probe, "iptables", "-S")
    except subprocess.CalledProcessError as exc:
        return f"iptables does not work in a namespace: {exc.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


def netns_add_works() -> bool:
    """Whether `ip netns add` itself succeeds (then CI must not skip the host tests)."""
    if shutil.which("ip") is None:
        return False
    probe = f"{PREFIX}{os.getpid():x}-can{uuid.uuid4().hex[:4]}"
    try:
        _run("ip", "netns", "add", probe)
    except (subprocess.CalledProcessError, OSError):
        return False
    _run("ip", "netns", "del", probe, check=False)
    return True


@dataclass(frozen=True)
class Host:
    """One namespace, its address on the switch, and its own hostname for what runs in it."""

    role: str
    ns: str
    ip: str

    def command(self, *argv: str) -> list[str]:
        """`argv` run in this host: its network namespace and a UTS namespace of its own
        named after the role (so workers on two hosts are told apart by hostname)."""
        rename = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c", rename,
                self.role, *argv]  # fmt: skip

    def spawn(
        self, argv: Sequence[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `argv` in this host, output to `log`; SIGKILLed if the test process dies."""
        with log.open("ab") as out:
            return subprocess.Popen(
                self.command(*argv), stdout=out, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, signal.SIGKILL),
            )  # fmt: skip

    def pids(self) -> list[int]:
        """Every process in this host's network namespace."""
        out = _run("ip", "netns", "pids", self.ns, check=False).stdout
        return [int(pid) for pid in out.split()]

    def kill_all(self) -> list[int]:
        """SIGKILL every process in the host at once, as a host that loses power; return them."""
        return _kill_namespace(self.ns)


@dataclass
class Network:
    """A switch and the hosts on it; `close` removes all of it, whatever state it is in."""

    octet: int
    token: str = field(default_factory=lambda: f"{PREFIX}{os.getpid():x}{uuid.uuid4().hex[:3]}")
    hosts: dict[str, Host] = field(default_factory=dict)
    _links: int = 0
    _delay: subprocess.Popen[str] | None = None

    @property
    def switch(self) -> str:
        return f"{self.token}-sw"

    @property
    def observer_ip(self) -> str:
        return self.address(OBSERVER_OCTET)

    def address(self, last: int) -> str:
        return SUBNET.format(self.octet).replace("0/24", str(last))

    @classmethod
    @contextlib.contextmanager
    def made(cls) -> Iterator[Network]:
        """A new switch with the observer's link; removed on exit."""
        remove_left_behind()
        network = cls(free_octet())
        try:
            network._make_switch()
            yield network
        finally:
            network.close()

    def _make_switch(self) -> None:
        sw = self.switch
        _run("ip", "netns", "add", sw)
        _run("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", sw, "link", "set", "br0", "up")
        _run("ip", "netns", "exec", sw, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1")
        for chain in ("TQCUT", "TQDEGRADE"):
            self._iptables("-N", chain)
            self._iptables("-A", "FORWARD", "-j", chain)
        # The observer: the test process's own link into the switch, never cut nor degraded.
        outside, inside = self._link_names()
        _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside, "netns", sw)
        _run("ip", "addr", "add", f"{self.observer_ip}/24", "dev", outside)
        _run("ip", "link", "set", outside, "up")
        self._attach(inside)

    def _link_names(self) -> tuple[str, str]:
        self._links += 1
        base = f"{self.token}{self._links}"
        assert len(base) + 1 <= 15, base  # IFNAMSIZ
        return f"{base}a", f"{base}b"

    def _attach(self, port: str) -> None:
        _run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
        _run("ip", "-n", self.switch, "link", "set", port, "up")

    def add_host(self, role: str, last_octet: int) -> Host:
        """A new namespace with loopback up and one link to the switch."""
        host = Host(role, f"{self.token}-{role}", self.address(last_octet))
        _run("ip", "netns", "add", host.ns)
        _run("ip", "-n", host.ns, "link", "set", "lo", "up")
        outside, inside = self._link_names()
        _run("ip", "link", "add", outside, "netns", host.ns, "type", "veth",
             "peer", "name", inside, "netns", self.switch)  # fmt: skip
        _run("ip", "-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", outside)
        _run("ip", "-n", host.ns, "link", "set", outside, "up")
        self._attach(inside)
        self.hosts[role] = host
        return host

    # --- faults ---------------------------------------------------------------------------

    def _cut_rules(self, host: Host, peer: Host | None) -> list[list[str]]:
        if peer is None:
            return [["-s", host.ip, "-j", "DROP"], ["-d", host.ip, "-j", "DROP"]]
        return [
            ["-s", host.ip, "-d", peer.ip, "-j", "DROP"],
            ["-s", peer.ip, "-d", host.ip, "-j", "DROP"],
        ]

    def cut(self, host: Host, peer: Host | None = None) -> None:
        """Drop, silently, every packet of `host` (or every one between it and `peer`)."""
        for rule in self._cut_rules(host, peer):
            self._iptables("-A", "TQCUT", *rule)

    def heal(self, host: Host, peer: Host | None = None) -> None:
        for rule in self._cut_rules(host, peer):
            self._iptables("-D", "TQCUT", *rule)

    def heal_all(self) -> None:
        self._iptables("-F", "TQCUT", check=False)

    def degrade(self, loss: float, delay_ms: float) -> None:
        """Every packet between two hosts: dropped with probability `loss`, the rest held
        `delay_ms` (each one way: a round trip between two hosts takes twice that)."""
        assert self._delay is None, "degraded already"
        script = Path(__file__).with_name("delay.py")
        self._delay = subprocess.Popen(
            ["ip", "netns", "exec", self.switch, sys.executable, str(script),
             str(DELAY_QUEUE), str(delay_ms)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, preexec_fn=functools.partial(die_with_parent, signal.SIGKILL),
        )  # fmt: skip
        assert self._delay.stdout is not None
        ready = self._delay.stdout.readline().strip()  # bounded: it exits on any failure
        if ready != "ready":
            self._delay.kill()
            raise RuntimeError(
                f"the delay queue did not start: {ready} {self._delay.stdout.read()}"
            )
        for exempt in ("-s", "-d"):  # the observer is no part of the system under test
            self._iptables("-A", "TQDEGRADE", exempt, self.observer_ip, "-j", "RETURN")
        self._iptables("-A", "TQDEGRADE", "-m", "statistic", "--mode", "random",
                       "--probability", str(loss), "-j", "DROP")  # fmt: skip
        self._iptables("-A", "TQDEGRADE", "-j", "NFQUEUE", "--queue-num", str(DELAY_QUEUE))

    def restore(self) -> str:
        """Undo `degrade`; return what the delay queue said it did."""
        self._iptables("-F", "TQDEGRADE", check=False)
        if self._delay is None:
            return ""
        delay, self._delay = self._delay, None
        still_running = delay.poll() is None
        delay.terminate()
        try:
            out, _ = delay.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            delay.kill()
            out, _ = delay.communicate()
        if not still_running:
            raise RuntimeError(f"the delay queue had died: {out}")
        return out.strip()

    def _iptables(self, *args: str, check: bool = True) -> None:
        _run("ip", "netns", "exec", self.switch, "iptables", "-w", "5", *args, check=check)

    # --- teardown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process in every host, then remove the namespaces (and so the links)."""
        with contextlib.suppress(Exception):
            self.restore()
        for name in [h.ns for h in self.hosts.values()] + [self.switch]:
            _kill_namespace(name)
            _run("ip", "netns", "del", name, check=False)
        self.hosts.clear()


def free_octet() -> int:
    """A third octet of 10.231.X.0/24 that no address in this namespace uses."""
    used = set(re.findall(r"inet 10\.231\.(\d+)\.", _run("ip", "-4", "-o", "addr").stdout))
    free = [n for n in range(16, 240) if str(n) not in used]
    return random.choice(free)


def remove_left_behind() -> None:
    """Remove the namespaces of runs whose process is gone (killed before their teardown)."""
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        found = re.fullmatch(rf"{PREFIX}([0-9a-f]+?)[0-9a-f]{{3}}-\w+", name)
        if found is None or psutil.pid_exists(int(found.group(1), 16)):
            continue
        _kill_namespace(name)
        _run("ip", "netns", "del", name, check=False)


def _kill_namespace(ns: str) -> list[int]:
    """SIGKILL every process in namespace `ns`, and wait (bounded) until none is left."""
    killed: list[int] = []
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        out = _run("ip", "netns", "pids", ns, check=False).stdout
        pids = [int(pid) for pid in out.split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.05)
    return killed


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, check=check, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
