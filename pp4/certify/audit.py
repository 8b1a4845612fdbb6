"""Audit a build against its certificate: `ninja certify`, or

    python -m pp4.audit build/certificate.json.gz [--objects] [--recompile N] [--invalidate]

Rechecks the certificate's hash against the build record, and for every object that compiling it
now would still give it: its sha256, every input's sha256, the identity of the compilers it ran
(pp4.compilers) and the probe digest of its include search (pp4.probes), all against the
certificate; each object's action against the store; every module against its pin and the build
record. --recompile N compiles N reused objects again in scratch from their stored command and
compares them with the stored object byte for byte, except the only bytes two nvcc runs differ in:
the process id nvcc writes into its temporary file names (tmpxft_<pid>_...), which end up in symbol
names (docs/reuse.md). Exits non-zero on any mismatch.

--invalidate removes every object and module the audit found out of date, so that the next `ninja`
rebuilds exactly those (and links what uses them): the repair when an input changed in a way
ninja's mtimes do not show (a file written with an old mtime, a header appearing where the
include search looks, a compiler edited in place).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pp4 import interrupt
from pp4.certify import certificate, pin
from pp4.reuse import actionkey, inputsets
from pp4.reuse.basis import Basis
from pp4.reuse.relocate import Relocation
from pp4.store.local import Store
from pp4.store.records import StoreError
from pp4.toolchain.compilerenv import process_env
from pp4.toolchain.compilers import CompilerError, Compilers

# nvcc names its temporary files tmpxft_<8 hex digits of its pid>_<8 hex digits>-<n>_<name>.
_TMPXFT = re.compile(rb"tmpxft_([0-9a-f]{8})_[0-9a-f]{8}-\d+_")


def differing_bytes(a: bytes, b: bytes) -> list[int]:
    """Offsets where two objects differ outside the pid digits of nvcc's temporary file names.

    The masked spans must sit at the same offsets in both; anything else counts as a difference.
    """
    if len(a) != len(b):
        return [min(len(a), len(b))]
    spans_a = [m.span(1) for m in _TMPXFT.finditer(a)]
    spans_b = [m.span(1) for m in _TMPXFT.finditer(b)]
    if spans_a != spans_b:
        return [spans_a[0][0] if spans_a else 0]
    ma, mb = bytearray(a), bytearray(b)
    for s, e in spans_a:
        ma[s:e] = mb[s:e] = b"0" * (e - s)
    if ma == mb:
        return []
    return [i for i in range(len(ma)) if ma[i] != mb[i]][:16]


class Audit:
    def __init__(self, cert_path: Path, store_dir: str | None, config: dict, doc: dict | None = None):
        """doc: a certificate document made now for what is built (``--built`` before `ninja` has
        written the certificate): audited the same way, with no build record to compare."""
        self.cert_path = cert_path
        self.doc, self.digest = (doc, None) if doc is not None else certificate.read(cert_path)
        self.store_problem = None
        try:
            self.store = Store(store_dir) if store_dir else None
        except StoreError as e:  # unusable store (read-only, no layout): objects that name an action fail below
            self.store, self.store_problem = None, str(e)
        state_dir = config["reuse"]["state_dir"]
        tmpdir = Path(config["limits"].get("tmpdir") or tempfile.gettempdir())
        self.relocation = Relocation.from_dict(config["reuse"].get("relocation"))
        self.basis = Basis(Compilers.from_dict(config["compile"]["compilers"]), state_dir, tmpdir, self.relocation)
        self.hasher = self.basis.hasher
        self.sets_dir = inputsets.directory(state_dir)
        self.failures: list[str] = []
        self.per_object: list[tuple[str, str, str]] = []
        self.stale: list[str] = []  # outputs that compiling now would not give: --invalidate removes them

    def fail(self, what: str) -> None:
        self.failures.append(what)

    def check_record(self) -> None:
        """The build record names this certificate, and every module is the one both name."""
        if self.digest is None:  # a document made now: its modules were just checked against their pins
            by_target = {m["target"]: m for m in self.doc["modules"]}
        else:
            rec_path = certificate.record_path(self.cert_path)
            try:
                record = json.loads(rec_path.read_text())
            except (OSError, ValueError) as e:
                self.fail(f"build record {rec_path} missing or damaged ({e})")
                return
            if record["certificate"]["sha256"] != self.digest:
                self.fail(f"certificate hash {self.digest} is not the one the build record names "
                          f"({record['certificate']['sha256']})")
            by_target = {m["target"]: m for m in record["modules"]}
        for m in self.doc["modules"]:
            module = Path(m["file"])
            sha = self.hasher.sha256(str(module))
            if sha != m["sha256"] or by_target.get(m["target"], {}).get("sha256") != m["sha256"]:
                self.fail(f"module {module}: sha256 {sha} differs from the certificate/build record ({m['sha256']})")
                self.stale.append(str(module))
                continue
            try:
                pin.check(module, sha)
            except pin.PinError as e:
                self.fail(str(e))
                self.stale.append(str(module))

    def check_input_sets(self) -> dict[str, list[str]]:
        """Each shared input set once: its name must be its content's hash, its files their bytes."""
        problems = {}
        for sid, entries in self.doc.get("input_sets", {}).items():
            if entries is None or inputsets.set_id(entries) != sid:
                problems[sid] = [f"the certificate's input set {sid[:16]} does not hash to its name"]
                continue
            local = self.relocation.local
            problems[sid] = [f"input {local(p)} has sha256 {got}, certificate says {want}"
                             for p, want in entries if (got := self.hasher.sha256(local(p))) != want]
        return problems

    def check_objects(self) -> None:
        set_problems = self.check_input_sets()
        for obj in self.doc["objects"]:
            problems = []
            sha = self.hasher.sha256(obj["output"])
            if sha != obj["object_sha256"]:
                problems.append(f"object sha256 is {sha}, certificate says {obj['object_sha256']}")
            root = obj.get("root")
            for p, want in obj["inputs"]:
                path = actionkey.from_src(p, root)
                got = self.hasher.sha256(path)
                if got != want:
                    problems.append(f"input {path} has sha256 {got}, certificate says {want}")
            for sid in obj.get("input_sets", []):
                problems += set_problems.get(sid, [f"input set {sid[:16]} is not in the certificate"])
            bound = obj.get("source_realpath")
            if bound and os.path.realpath(obj["source"]) != bound:
                problems.append(f"the object names its source's folder {os.path.dirname(bound)} (an anonymous "
                                f"namespace), but the source is now {os.path.realpath(obj['source'])}")
            if not problems:  # same bytes in: do the compilers and the include search still match?
                problems += self.check_basis(obj)
            if problems:
                self.stale.append(obj["output"])
            if self.store is None and self.store_problem and obj.get("action_key"):
                problems.append(f"action {obj['action_key'][:16]} cannot be checked: {self.store_problem}")
            if self.store is not None and obj.get("action_key"):
                record = self.store.lookup(obj["action_key"])
                if record is None:
                    problems.append(f"action {obj['action_key'][:16]} is not in the store {self.store.root}"
                                    if obj["status"] == "reused" else None)
                elif record.object_sha256 != obj["object_sha256"] and self._stored_for(record, obj):
                    problems.append(f"the store's object for action {obj['action_key'][:16]} has sha256 "
                                    f"{record.object_sha256}, certificate says {obj['object_sha256']}")
            problems = [p for p in problems if p]
            status = "FAILED" if problems else obj["status"]
            detail = "; ".join(problems) if problems else (
                f"from {obj['reused_from']['output']}" if obj["status"] == "reused" and obj.get("reused_from")
                else f"{obj.get('compile_duration_s')} s")
            self.per_object.append((status, obj["output"], detail))
            for p in problems:
                self.fail(f"{obj['output']}: {p}")

    def check_basis(self, obj: dict) -> list[str]:
        """What compiling the object now would depend on besides its inputs' bytes: the compilers
        it runs and what its include search finds."""
        if obj.get("probes") is None or "argv" not in obj:
            return ["the certificate does not record its compile's basis (written by an older pp4): rebuild"]
        args = actionkey.parse_compile(obj["argv"])
        env = obj.get("env", {})
        try:
            now = self.basis.identity(args, env).hashes
        except (CompilerError, OSError) as e:
            return [f"its compilers cannot be identified now ({e})"]
        if obj.get("toolchain") is not None and now != obj["toolchain"]:
            changed = sorted(k for k in set(now) | set(obj["toolchain"]) if now.get(k) != obj["toolchain"].get(k))
            return [f"the compilers it ran changed since it was built ({', '.join(changed)})"]
        root = obj.get("root")
        own = [(actionkey.from_src(p, root), p) for p, _ in obj["inputs"]]
        digest = self.basis.probe_digest(args, env, own, obj.get("input_sets", []), self.sets_dir)
        if digest != obj["probes"]:
            return ["a file appeared or vanished where its include search looks"
                    + self._new_candidates(obj, args, env, own)]
        return []

    def _new_candidates(self, obj: dict, args, env, own) -> str:
        """The files its include search could find now that are newer than the object: the likely cause."""
        files = [p for p, _ in own] + [p for sid in obj.get("input_sets", [])
                                       for p in self.basis.sets.paths(self.sets_dir, sid)]
        try:
            built = os.stat(obj["output"]).st_mtime
        except OSError:
            return ""
        new = [p for p in self.basis.prober.present_paths(files, self.basis.search_path(args, env))
               if os.stat(p).st_ctime > built]
        return f" (new since it was built: {', '.join(new[:5])})" if new else ""

    def invalidate(self) -> list[str]:
        """Remove the stale outputs (and any restore marker beside them): the next ninja rebuilds them."""
        removed = []
        for out in dict.fromkeys(self.stale):
            for p in (Path(out), Path(out + ".pp4-reused")):
                try:
                    p.unlink()
                    if p == Path(out):
                        removed.append(out)
                except FileNotFoundError:
                    pass
        return removed

    @staticmethod
    def _stored_for(record, obj: dict) -> bool:
        """Whether the store's record for an action is this object's own. A compiled object's twin
        (the same unit of another variant, compiled at the same time) may have stored it instead:
        then the two objects differ only in the source paths they embed, and neither is wrong."""
        if obj["status"] == "reused":
            return True
        stored_for = (record.payload.get("compiled_for") or {}).get("output", "")
        return os.path.abspath(obj["output"]) == stored_for or obj["output"] == stored_for

    def recompile(self, n: int, scratch: Path) -> list[str]:
        """Recompile n reused objects from their stored commands; one line of result each."""
        lines = []
        reused = [o for o in self.doc["objects"] if o["status"] == "reused"]
        if self.store is None:
            self.fail("--recompile needs the store (reuse was off for this build)")
            return lines
        for obj in sorted(reused, key=lambda o: o["output"])[:n]:
            record = self.store.lookup(obj["action_key"])
            if record is None:
                self.fail(f"{obj['output']}: action {obj['action_key'][:16]} is gone from the store")
                continue
            # This build's sources: the question is whether compiling here gives the object used
            # here (a CUDA object may name its source's folder, pp4/reuse/actionkey.py).
            root = obj.get("root") or (obj.get("reused_from") or {}).get("root")
            out, dep = scratch / "recompiled.o", scratch / "recompiled.o.d"
            argv = [{"$OUT": str(out), "$DEP": str(dep)}.get(a, self.relocation.local(actionkey.from_src(a, root)))
                    for a in record.payload["command"]]
            argv[1:1] = [f"-D{k}={v}" for k, v in sorted(record.payload.get("erased", {}).items())]
            t0 = time.monotonic()
            # In the folder it was compiled in: debug information records it (actionkey.embeds_cwd).
            cwd = (record.payload.get("compiled_for") or {}).get("cwd")
            proc = subprocess.run(argv, env=process_env(record.payload.get("env", {}), scratch),
                                  cwd=cwd if cwd and os.path.isdir(cwd) else None, capture_output=True, text=True)
            if proc.returncode != 0:
                self.fail(f"{obj['output']}: recompiling failed:\n{proc.stderr[-2000:]}")
                continue
            stored = self.store.object_path(record.object_sha256).read_bytes()
            diff = differing_bytes(stored, out.read_bytes())
            verdict = "identical except nvcc's temporary-file pid digits" if not diff else f"DIFFERS at bytes {diff}"
            if diff:
                self.fail(f"{obj['output']}: recompiled object differs from the stored one at bytes {diff}")
            lines.append(f"  recompiled {obj['output']} in {time.monotonic() - t0:.1f} s: {verdict}")
        return lines


@interrupt.command("pp4.audit")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pp4.audit", description="Audit a pp4 build against its certificate.")
    ap.add_argument("certificate", type=Path)
    ap.add_argument("--objects", action="store_true", help="one line per object")
    ap.add_argument("--recompile", type=int, default=0, metavar="N",
                    help="recompile N reused objects in scratch and compare them byte for byte")
    ap.add_argument("--store", help="the store (default: the one build/pp4.json names)")
    ap.add_argument("--invalidate", action="store_true",
                    help="remove the objects and modules found out of date, so that the next `ninja` rebuilds them")
    ap.add_argument("--built", action="store_true",
                    help="`ninja certify`: with no certificate yet, audit the modules built so far (never "
                         "build anything) and name the ones not built")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    builddir = args.certificate.parent
    doc, not_built = None, []
    try:
        config = json.loads((builddir / "pp4.json").read_text())
        store_dir = args.store or config["reuse"]["store"]
        if args.built:
            built, not_built = certificate.built_targets(builddir, builddir / "actions.json")
            if not args.certificate.exists():
                if not built:
                    print("pp4.audit: nothing is built yet, so nothing is certified: run `ninja` (every module) "
                          f"or `ninja TARGET` (one of {', '.join(not_built)})", file=sys.stderr)
                    return 1
                doc = certificate.document(builddir / "pp4.json", builddir / "actions.json", builddir, set(built))
        audit = Audit(args.certificate, store_dir, config, doc)
    except (certificate.CertificateError, pin.PinError, OSError, ValueError, KeyError) as e:
        print(f"pp4.audit: error: {e}", file=sys.stderr)
        return 1
    audit.check_record()
    audit.check_objects()
    lines = []
    if args.recompile:
        with tempfile.TemporaryDirectory(dir=config["reuse"]["state_dir"], prefix="recompile-") as tmp:
            lines = audit.recompile(args.recompile, Path(tmp))
    objs = audit.doc["objects"]
    reused = sum(o["status"] == "reused" for o in objs)
    failed = sum(s == "FAILED" for s, _, _ in audit.per_object)
    inputs = audit.hasher.files_hashed()
    if doc is None:
        print(f"certificate {args.certificate}: sha256 {audit.digest}")
    else:
        print(f"no certificate yet ({args.certificate} is written by `ninja`): audited what is built, "
              f"{', '.join(m['target'] for m in doc['modules'])}")
    print(f"  {len(objs)} objects: {reused} reused, {len(objs) - reused} compiled, {failed} failed; "
          f"{len(audit.doc['modules'])} modules; {inputs} files hashed in {time.monotonic() - t0:.2f} s "
          f"({time.process_time():.2f} CPU-s with start-up)")
    if not_built:
        print(f"  not built yet: {', '.join(not_built)} (`ninja TARGET` builds one; `ninja` builds and certifies all)")
    if args.objects:
        for status, out, detail in audit.per_object:
            print(f"  {status:8} {out}  {detail}")
    for line in lines:
        print(line)
    audit.basis.save()
    if args.invalidate:
        removed = audit.invalidate()
        for out in removed:
            print(f"  invalidated {out}")
        if removed:
            print(f"{len(removed)} output(s) removed: `ninja` rebuilds exactly these and what uses them")
    if audit.failures:
        print(f"AUDIT FAILED: {len(audit.failures)} mismatch(es):", file=sys.stderr)
        for f in audit.failures[:50]:
            print(f"  {f}", file=sys.stderr)
        if audit.stale and not args.invalidate:
            print(f"{len(dict.fromkeys(audit.stale))} output(s) no longer match how they were built. To rebuild "
                  f"exactly those: {sys.executable} -m pp4.audit --invalidate {args.certificate} && ninja", file=sys.stderr)
        return 1
    print("audit passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
