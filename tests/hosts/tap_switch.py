#!/usr/bin/env python3
"""An Ethernet switch in user space whose ports are TAP devices: delay and loss on every link.

    tap_switch.py [--seed S] PORT_NAME...

Where the kernel has no netem (and no NFQUEUE), this is how the hosts tests delay every
packet between two hosts, Gloo's included, without changing what a connection does: each
host's eth0 is a TAP device whose other end is this process, which reads every frame a host
sends, and writes it to the destination host's TAP (or to every other port: broadcast,
multicast, a MAC not learned yet) once its delay has passed, unless it drops it. TCP sees
a longer path and lost segments, nothing else: a refused connect is still refused (the RST
comes back one round trip later), a SYN that is lost is sent again by the kernel, and a
connection is never accepted by anything but its peer.

It makes one TAP device per PORT_NAME in its own network namespace and prints "ready"; the
caller then moves each into its host's namespace (the descriptor stays this process's).
Frames of one direction of one link leave in the order they came (each is due at its arrival
+ delay + a uniform draw in [0, jitter], and never before the frame ahead of it), so jitter
does not reorder; loss is drawn per frame and per link (random.Random(S): a seed repeats a
run's drops given the same frames).

It reads commands, one a line, on stdin and answers each with one line on stdout ("ok ..."
or "error: ..."):

    delay MS [JITTER_MS]   every link, each direction (a round trip gets 2 x MS more)
    loss PERCENT           every link, each direction, per frame
    down I | up I          port I cut off (every frame to or from it dropped, those in flight
                           too) or back
    stats                  one JSON line: frames read, forwarded, dropped (by loss, by a port
                           down, undeliverable), and how late the latest frame left (the
                           switch's own lag behind its schedule, from the CPU it waited for)

It exits when stdin ends (the harness is gone) or on SIGTERM, closing every TAP (the devices
go with it). Python's standard library only.
"""
import argparse
import errno
import fcntl
import heapq
import json
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA  # linux/if_tun.h: _IOW('T', 202, int)
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
BURST = 256  # frames read from one port before the others get a turn


class Switch:
    def __init__(self, names, seed):
        self.fds = []
        for name in names:
            fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
            self.fds.append(fd)
        self.port = {fd: i for i, fd in enumerate(self.fds)}
        self.where = {}  # learned MAC -> port
        self.queue = []  # heap of (due, sequence, source port, destination port, frame)
        self.last = {}  # (source, destination) -> due of the last frame queued that way
        self.seq = 0
        self.delay = self.jitter = 0.0
        self.loss = 0.0
        self.down = set()
        self.rng = random.Random(seed)
        self.stats = {"read": 0, "forwarded": 0, "lost": 0, "cut": 0, "undeliverable": {},
                      "late_max_ms": 0.0, "late_over_1ms": 0, "late_over_10ms": 0,
                      "late_over_50ms": 0}

    def command(self, line):
        words = line.split()
        try:
            if not words:
                return "error: empty command"
            if words[0] == "delay" and len(words) in (2, 3):
                d, j = float(words[1]), float(words[2]) if len(words) == 3 else 0.0
                if d < 0 or j < 0:
                    raise ValueError("negative")
                self.delay, self.jitter = d / 1000.0, j / 1000.0
            elif words[0] == "loss" and len(words) == 2:
                p = float(words[1])
                if not 0 <= p <= 100:
                    raise ValueError("not in [0, 100]")
                self.loss = p / 100.0
            elif words[0] in ("down", "up") and len(words) == 2:
                i = int(words[1])
                if not 0 <= i < len(self.fds):
                    raise ValueError(f"no port {i}")
                (self.down.add if words[0] == "down" else self.down.discard)(i)
            elif words[0] == "stats" and len(words) == 1:
                return "ok " + json.dumps(self.stats, sort_keys=True)
            else:
                return f"error: unknown command {line.strip()!r}"
        except ValueError as e:
            return f"error: {line.strip()!r}: {e}"
        return "ok " + line.strip()

    def receive(self, fd, now):
        src = self.port[fd]
        for _ in range(BURST):
            try:
                frame = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError as e:  # EIO: the host's end of the device is down
                if e.errno == errno.EIO:
                    return
                raise
            if len(frame) < 14:
                continue
            self.stats["read"] += 1
            dst_mac, src_mac = frame[0:6], frame[6:12]
            if not src_mac[0] & 1:
                self.where[src_mac] = src
            out = self.where.get(dst_mac) if not dst_mac[0] & 1 else None
            for dst in ([out] if out is not None else range(len(self.fds))):
                if dst != src:
                    self.enqueue(src, dst, frame, now)

    def enqueue(self, src, dst, frame, now):
        if src in self.down or dst in self.down:
            self.stats["cut"] += 1
            return
        if self.loss > 0 and self.rng.random() < self.loss:
            self.stats["lost"] += 1
            return
        due = now + self.delay + (self.rng.uniform(0, self.jitter) if self.jitter else 0.0)
        due = max(due, self.last.get((src, dst), 0.0))
        self.last[(src, dst)] = due
        self.seq += 1
        heapq.heappush(self.queue, (due, self.seq, src, dst, frame))

    def deliver(self, now):
        while self.queue and self.queue[0][0] <= now:
            due, _, src, dst, frame = heapq.heappop(self.queue)
            if src in self.down or dst in self.down:  # cut while in flight
                self.stats["cut"] += 1
                continue
            try:
                os.write(self.fds[dst], frame)
            except OSError as e:  # the host's end is down, or its queue is full: lost
                name = errno.errorcode.get(e.errno, str(e.errno))
                self.stats["undeliverable"][name] = self.stats["undeliverable"].get(name, 0) + 1
                continue
            self.stats["forwarded"] += 1
            late = (now - due) * 1000.0
            if late > self.stats["late_max_ms"]:
                self.stats["late_max_ms"] = round(late, 3)
            for bound in (1, 10, 50):
                if late > bound:
                    self.stats[f"late_over_{bound}ms"] += 1

    def run(self):
        poller = select.poll()
        for fd in self.fds:
            poller.register(fd, select.POLLIN)
        poller.register(0, select.POLLIN)
        pending = b""
        print("ready", flush=True)
        while True:
            wait = None
            if self.queue:
                wait = max(0.0, (self.queue[0][0] - time.monotonic()) * 1000.0)
            events = poller.poll(wait)
            now = time.monotonic()
            for fd, ev in events:
                if fd == 0:
                    data = os.read(0, 4096)
                    if not data:
                        return  # the harness is gone
                    pending += data
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        print(self.command(line.decode(errors="replace")), flush=True)
                elif ev & select.POLLIN:
                    self.receive(fd, now)
            self.deliver(time.monotonic())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("ports", nargs="+")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        switch = Switch(args.ports, args.seed)
    except OSError as e:
        print(f"error: cannot make a TAP device: {e}", flush=True)
        return 1
    switch.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
