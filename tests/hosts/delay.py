"""Holds every packet queued to it for a fixed time, then lets it go: latency on a link.

This machine's kernel has no `netem` (CONFIG_NET_SCH_NETEM is not set), so latency is made
in user space: iptables sends each packet the switch forwards to NFQUEUE, and this program,
bound to that queue in the switch's namespace, gives each its verdict (accept) `delay_ms`
after it arrived, in arrival order. Loss is the kernel's own (iptables' `statistic` match,
before the queue). Only the packets' metadata is copied up, never their payload.

Run as `ip netns exec SWITCH python delay.py QUEUE DELAY_MS`; it prints `ready` once bound,
and on SIGTERM accepts what it holds, prints how many packets it delayed, and exits.
Raw netfilter netlink (nfnetlink_queue), no library: the message layouts are the kernel's
`include/uapi/linux/netfilter/nfnetlink_queue.h`.
"""

from __future__ import annotations

import collections
import os
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_CONFIG = 2
NFQNL_MSG_VERDICT_BATCH = 3
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NF_ACCEPT = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
QUEUE_MAXLEN = 50_000
RECEIVE_BUFFER = 32 * 2**20


def _attr(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


def _message(kind: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST) -> bytes:
    body = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack(">H", queue) + attrs
    return (
        struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, 0, 0) + body
    )


def _acked(sock: socket.socket, request: bytes) -> None:
    sock.send(request)
    reply = sock.recv(65536)
    _length, kind = struct.unpack_from("=IH", reply)
    if kind == NLMSG_ERROR:
        (error,) = struct.unpack_from("=i", reply, 16)
        if error:
            raise OSError(-error, f"nfnetlink_queue refused: {os.strerror(-error)}")


def bind(queue: int) -> socket.socket:
    """A netlink socket bound to NFQUEUE `queue`, copying packets' metadata only."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, 33, RECEIVE_BUFFER)  # SO_RCVBUFFORCE (root)
    sock.bind((0, 0))
    command = struct.pack(">BxH", NFQNL_CFG_CMD_BIND, 0)
    _acked(sock, _message(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_CMD, command),
                          NLM_F_REQUEST | NLM_F_ACK))  # fmt: skip
    params = _attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))
    params += _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", QUEUE_MAXLEN))
    _acked(sock, _message(NFQNL_MSG_CONFIG, queue, params, NLM_F_REQUEST | NLM_F_ACK))
    return sock


def packet_ids(datagram: bytes) -> list[int]:
    """The ids of the queued packets a datagram from the kernel announces."""
    ids = []
    offset = 0
    while offset + 16 <= len(datagram):
        length, kind = struct.unpack_from("=IH", datagram, offset)
        if length < 16:
            break
        if kind & 0xFF == NFQNL_MSG_PACKET and kind >> 8 == NFNL_SUBSYS_QUEUE:
            at = offset + 20  # past nlmsghdr and nfgenmsg
            while at + 4 <= offset + length:
                attr_length, attr_kind = struct.unpack_from("=HH", datagram, at)
                if attr_length < 4:
                    break
                if attr_kind & 0x3FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from(">I", datagram, at + 4)[0])
                    break
                at += (attr_length + 3) & ~3
        offset += (length + 3) & ~3
    return ids


def accept_up_to(sock: socket.socket, queue: int, packet_id: int) -> None:
    """Accept every packet held with an id up to `packet_id` (one batch verdict)."""
    verdict = _attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, packet_id))
    sock.send(_message(NFQNL_MSG_VERDICT_BATCH, queue, verdict))


def main(queue: int, delay_ms: float) -> int:
    delay_s = delay_ms / 1000
    sock = bind(queue)
    held: collections.deque[tuple[float, int]] = collections.deque()
    stopping = False
    delayed = 0

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    while not stopping:
        now = time.monotonic()
        due = None
        while held and held[0][0] <= now:
            due = held.popleft()[1]
        if due is not None:
            accept_up_to(sock, queue, due)
        wait = max(0.0, held[0][0] - now) if held else 0.5
        try:
            readable, _, _ = select.select([sock], [], [], wait)
        except InterruptedError:
            continue
        if readable:
            try:
                datagram = sock.recv(1 << 20)
            except OSError:  # ENOBUFS: the kernel dropped what did not fit (lost packets)
                continue
            arrived = time.monotonic()
            for packet_id in packet_ids(datagram):
                held.append((arrived + delay_s, packet_id))
                delayed += 1
    if held:
        accept_up_to(sock, queue, held[-1][1])
    print(f"delayed {delayed} packets by {delay_ms:g} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(int(sys.argv[1]), float(sys.argv[2])))
