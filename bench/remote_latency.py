#!/usr/bin/env python3
"""A restore from the remote tier over a slow link: a fresh machine (an empty local store, a new
build folder) restores every object of a build from a Redis server behind a local proxy that
delays every reply by --delay-ms, as a network round trip would.

    python bench/remote_latency.py [--ext p2p] [--delay-ms 20] [--rounds 3]

It starts its own redis-server and proxy, fills the server with one cold build (a folder of its
own, compiled here), then restores into fresh folders ROUNDS times: wall and CPU of the whole `ninja`
(its servers included: bench/accounting.py), how many round trips the build made (requests the proxy
passed on), and what the server holds (keys, bytes). Run from anywhere; folders under --work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from accounting import become_subreaper, reap_orphans  # noqa: E402


class DelayProxy:
    """TCP proxy to a server: every request the client sends (what one write of it brings) is held
    back `delay` seconds before it is passed on, so each round trip costs one delay, however large
    its reply; `requests` counts them."""

    def __init__(self, target_port: int, delay: float):
        self.target_port, self.delay = target_port, delay
        self.requests = 0
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


def run(cmd: list[str], cwd: Path) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ext", default="p2p")
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--configure-args", default="--arch 9.0", help="more configure options (e.g. --cuda-home DIR)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="remote-latency-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        redis_port = s.getsockname()[1]
    (work / "redis").mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen([shutil.which("redis-server"), "--port", str(redis_port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", str(work / "redis")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis

        client = redis.Redis(port=redis_port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        proxy = DelayProxy(redis_port, args.delay_ms / 1000)
        url = f"redis://127.0.0.1:{proxy.port}/0"
        configure = [sys.executable, str(REPO / "configure.py"), "--ext", args.ext, *args.configure_args.split(),
                     "--remote-store", url]
        first = work / "first"
        first.mkdir(exist_ok=True)
        run([*configure, "--store", str(first / "store")], first)
        run([shutil.which("ninja", path=os.path.dirname(sys.executable)) or "ninja"], first)
        keys = client.keys("pp4:*")
        size = sum(client.strlen(k) for k in keys)
        become_subreaper()
        ninja = shutil.which("ninja", path=os.path.dirname(sys.executable)) or "ninja"
        rounds = []
        for r in range(args.rounds):
            fresh = work / f"fresh{r}"
            fresh.mkdir()
            run([*configure, "--store", str(fresh / "store")], fresh)
            requests = proxy.requests
            before, t0 = os.times(), time.monotonic()
            out = run([ninja], fresh)
            reap_orphans()
            wall, after = time.monotonic() - t0, os.times()
            cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
            doc = json.loads(__import__("gzip").decompress((fresh / "build" / "certificate.json.gz").read_bytes()))
            remote = sum(o.get("tier") == "remote" for o in doc["objects"])
            rounds.append((wall, cpu, proxy.requests - requests, remote, len(doc["objects"])))
            print(f"round {r}: {wall:.2f} s wall, {cpu:.2f} CPU-s, {proxy.requests - requests} round trips, "
                  f"{remote} of {len(doc['objects'])} objects from the remote", flush=True)
        print(f"{args.ext} from Redis behind {args.delay_ms:g} ms a reply: median {statistics.median(r[0] for r in rounds):.2f} s wall, "
              f"{statistics.median(r[1] for r in rounds):.2f} CPU-s, {statistics.median(r[2] for r in rounds):.0f} round trips; "
              f"the server holds {len(keys)} keys, {size / 1e6:.2f} MB, for {rounds[0][4]} objects "
              f"({len(keys) / max(1, rounds[0][4]):.1f} keys an object)")
    finally:
        server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
