#!/usr/bin/env python3
"""What signatures cost (pp4/store/signing.py): one sign and one verify of a real entry's statement,
and their share of a warm restore of a real build.

    python bench/build/signing_cost.py BUILD_DIR [--rounds 6]

BUILD_DIR: a build folder whose objects are all stored (P2P's, say), run from the folder configure
ran in. Each round restores every object into a fresh copy of the build folder from the warm local
store (`ninja`, the whole build, its servers' CPU counted: bench/common/accounting.py), and counts the
signatures checked (the events' restored entries) and made (none: a restore stores nothing). The
sign and verify times are medians of 2,000 calls on the statement of the build's first object, as
pp4 makes it, with this builder's own key. The share is verifies x verify time / the restore's CPU,
both measured in this one run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the checkout: pp4, and bench.common for the helpers

from bench.common.accounting import become_subreaper, reap_orphans  # noqa: E402

from pp4.reuse.wrapper import signed_part  # noqa: E402
from pp4.store import signing  # noqa: E402
from pp4.store.local import Store  # noqa: E402


def median_us(call, n: int = 2000) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("build", type=Path)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    work = Path.cwd()
    config = json.loads((args.build / "pp4.json").read_text())
    cert = json.loads(gzip.decompress((args.build / "certificate.json.gz").read_bytes()))
    obj = cert["objects"][0]
    record = Store(config["reuse"]["store"]).lookup(obj["action_key"])
    signer = signing.load_signer(config["reuse"]["trust"].get("signing_key"))
    trust = signing.load_trust(own=signer.public)
    message = signing.statement(record.action_key, record.object_sha256, record.object_size, obj["input_sets"],
                                record.payload)
    signature = {"signer": signer.public.key, "sig": signer.sign(message)}
    sign_us = median_us(lambda: signer.sign(message))
    verify_us = median_us(lambda: trust.verdict(record.action_key, record.object_sha256, record.object_size,
                                                obj["input_sets"], record.payload, [signature]))
    assert trust.verdict(record.action_key, record.object_sha256, record.object_size, obj["input_sets"],
                         signed_part(record.payload), [signature]).ok
    become_subreaper()
    ninja = shutil.which("ninja", path=os.path.dirname(sys.executable)) or "ninja"
    rounds = []
    for _ in range(args.rounds):
        for o in cert["objects"]:
            Path(o["output"]).unlink(missing_ok=True)
        before = os.times()
        t0 = time.monotonic()
        out = subprocess.run([ninja], cwd=work, capture_output=True, text=True)
        reap_orphans()
        wall = time.monotonic() - t0
        after = os.times()
        if out.returncode != 0:
            sys.exit(out.stdout + out.stderr)
        now = json.loads(gzip.decompress((args.build / "certificate.json.gz").read_bytes()))
        restored = [o for o in now["objects"] if o["status"] == "reused"]
        if len(restored) != len(now["objects"]):
            sys.exit(f"{len(now['objects']) - len(restored)} objects were compiled, not restored: "
                     "the bench measures warm restores")
        checked = sum(len(o.get("signatures") or []) for o in restored)
        cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        rounds.append((cpu, wall, checked))
    cpu = statistics.median(c for c, _, _ in rounds)
    wall = statistics.median(w for _, w, _ in rounds)
    checked = rounds[-1][2]
    print(f"sign {sign_us:.0f} us, verify {verify_us:.0f} us (median of 2,000, one statement of "
          f"{len(message)} bytes); a warm restore of {len(cert['objects'])} objects ({args.rounds} rounds): "
          f"median {cpu:.2f} CPU-s, {wall:.2f} s wall, {checked} signatures verified: "
          f"{checked * verify_us / 1e6 / cpu:.2%} of its CPU, {checked * verify_us / 1e6 / wall:.2%} of its wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
