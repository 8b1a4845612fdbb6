#!/usr/bin/env python3
"""A TCP proxy that holds every request back, as a network's round trip would, and counts them.

    python bench/common/delay_proxy.py --to PORT [--port PORT] [--delay-ms 20] [--count-file FILE]

Every request a client sends (what one write of it brings) waits --delay-ms before it goes on to
127.0.0.1:--to; replies pass at once, so a round trip costs one delay however large its reply. With
--count-file, the number of requests passed on so far is written there after each one. Imported by
bench/build/remote_restore.py; run alone on the device machine (bench/device/exl3_restore_latency.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import threading
import time


class DelayProxy:
    """TCP proxy to a server: every request the client sends (what one write of it brings) is held
    back `delay` seconds before it is passed on, so each round trip costs one delay, however large
    its reply; `requests` counts them."""

    def __init__(self, target_port: int, delay: float, port: int = 0):
        self.target_port, self.delay = target_port, delay
        self.requests = 0
        self.port = port
        if not port:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def pipe(reader, writer, delayed: bool):
            try:
                while data := await reader.read(1 << 20):
                    if delayed:
                        self.requests += 1
                        await asyncio.sleep(self.delay)
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        async def serve(client_reader, client_writer):
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            await asyncio.gather(pipe(client_reader, server_writer, True), pipe(server_reader, client_writer, False))

        async def main():
            server = await asyncio.start_server(serve, "127.0.0.1", self.port)
            ready.set()
            async with server:
                await server.serve_forever()

        self.loop.run_until_complete(main())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--to", type=int, required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--count-file")
    args = ap.parse_args()
    proxy = DelayProxy(args.to, args.delay_ms / 1000, port=args.port)
    print(proxy.port, flush=True)
    last = -1
    while True:
        time.sleep(0.05)
        if args.count_file and proxy.requests != last:
            last = proxy.requests
            with open(args.count_file, "w") as f:
                f.write(f"{last}\n")


if __name__ == "__main__":
    sys.exit(main())
