#!/usr/bin/env python3
"""bench/delay_relay.py: a link's latency where the kernel has no netem qdisc.

Forwards every TCP connection made to LISTEN on to TARGET, holding each byte DELAY_MS in each
direction before it goes on (a half-close too), so a connection through it sees DELAY_MS more
one-way latency. bench/streaming_tcp.sh puts one in front of each peer (the peer listens on
127.0.0.1 and advertises the relay's address) and shapes the rate with tbf as before. At most
QUEUE_MB of a direction waits in the relay (then it stops reading, and TCP's flow control holds
the sender back), so a burst is not absorbed without bound.

    bench/delay_relay.py LISTEN_HOST:PORT TARGET_HOST:PORT DELAY_MS [QUEUE_MB]

Runs until killed. A bench helper, not part of the library.
"""
import asyncio
import sys
import time


def split(address):
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        sys.exit(f"delay_relay: '{address}' is not HOST:PORT")
    return host, int(port)


async def pump(reader, writer, delay_s, queue_chunks):
    queue = asyncio.Queue(maxsize=queue_chunks)

    async def feed():
        while True:
            data = await reader.read(1 << 16)
            await queue.put((time.monotonic() + delay_s, data))
            if not data:
                return

    async def deliver():
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    try:
        await asyncio.gather(feed(), deliver())
    except (ConnectionError, OSError):
        writer.close()


async def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    listen, target = split(sys.argv[1]), split(sys.argv[2])
    delay_s = float(sys.argv[3]) / 1000
    queue_chunks = max(1, int(float(sys.argv[4] if len(sys.argv) == 5 else 4) * 16))  # 64 KiB chunks

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pump(client_reader, server_writer, delay_s, queue_chunks),
                             pump(server_reader, client_writer, delay_s, queue_chunks))
        for w in (client_writer, server_writer):
            w.close()

    server = await asyncio.start_server(handle, *listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
