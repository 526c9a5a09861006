#!/usr/bin/env python3
"""A delaying TCP relay for one test host (a network namespace), where the kernel has no netem.

    delay_relay.py PORT DELAY_MS

nftables redirects the host's outgoing TCP connections to other hosts to 127.0.0.1:PORT
(hosts.py installs the rule); the relay finds each one's real destination
(SO_ORIGINAL_DST), connects there itself (its own connections carry the mark 0x4347, which the
rule lets through) and forwards the bytes both ways, each chunk held DELAY_MS milliseconds
after it arrived: every connection this host opens gets DELAY_MS more in each direction, so
a round trip between two hosts takes 2 x DELAY_MS more. Order and end of stream are kept; a
destination that refuses is tried again for 5 s (the client's connect succeeded at once, at
the relay, so it cannot retry it itself), then the client's side is closed, as it is when the
destination resets. It runs until SIGTERM or SIGKILL.
"""
import asyncio
import signal
import socket
import struct
import sys

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
MARK = 0x4347


def original_destination(sock):
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port


async def pump(reader, writer, delay):
    """Copies reader to writer, each chunk DELAY seconds after it was read."""
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def read():
        try:
            while True:
                data = await reader.read(65536)
                await queue.put((loop.time() + delay, data))
                if not data:
                    return
        except (ConnectionError, OSError):
            await queue.put((loop.time() + delay, b""))

    task = asyncio.ensure_future(read())
    try:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        task.cancel()


async def serve_one(client_reader, client_writer, delay):
    sock = client_writer.get_extra_info("socket")
    try:
        host, port = original_destination(sock)
        # The connection's first packet is delayed too. The client's connect succeeded at
        # once (here): a destination that refuses is tried again for a while, as the client
        # itself would retry a refused connect (a peer's listener may open a moment later).
        await asyncio.sleep(delay)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 5
        while True:
            out = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            out.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, MARK)
            out.setblocking(False)
            try:
                await loop.sock_connect(out, (host, port))
                break
            except ConnectionRefusedError:
                out.close()
                if loop.time() > give_up:
                    raise
                await asyncio.sleep(0.05)
        server_reader, server_writer = await asyncio.open_connection(sock=out)
    except (ConnectionError, OSError) as e:
        print(f"delay_relay: {e}", file=sys.stderr, flush=True)
        client_writer.close()
        return
    await asyncio.gather(pump(client_reader, server_writer, delay),
                         pump(server_reader, client_writer, delay))
    for w in (client_writer, server_writer):
        w.close()


async def main():
    port, delay_ms = int(sys.argv[1]), float(sys.argv[2])
    server = await asyncio.start_server(
        lambda r, w: serve_one(r, w, delay_ms / 1000.0), "127.0.0.1", port)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
