"""Audit a build against its certificate: `ninja certify`, or

    python -m pp4.certify.audit build/certificate.json.gz [--objects] [--recompile N] [--invalidate]

Rechecks the certificate's hash against the build record, and for every object that compiling it
now would still give it: its sha256, and every observation its compile made (each path its
processes opened, looked for, listed or ran, with the state found there: pp4/reuse/pathstates.py)
against the machine now, and its entry's signatures as the certificate keeps them; every module
against what its link made, its pin and the build record. The build is judged by its own
certificate: the store is a cross-check, and an entry it no longer holds (evicted by gc) is a note,
not a failure; an entry it holds for another object fails. It compiles nothing. --recompile N
compiles N reused objects again from their command, in the fixed execution root, and compares them
with the stored object byte for byte, with nothing masked (it needs the store). Exits non-zero on
any mismatch.

--invalidate removes every object and module the audit found out of date, so that the next `ninja`
rebuilds exactly those (and links what uses them): the repair when an input changed in a way
ninja's mtimes do not show (a file written with an old mtime, a header appearing where the
include search looks, a compiler edited in place).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import attrs

from pp4.sizes import counted
from pp4.build import config as buildconfig
from pp4 import interrupt
from pp4.certify import certificate, pin
from pp4.execution.root import Root
from pp4.execution.run import run
from pp4.reuse import inputsets, pathstates
from pp4.reuse.actionkey import FileHasher
from pp4.store.local import Store
from pp4.store.records import CorruptObject, ObjectMissing, StoreError
from pp4.toolchain.limits import Limits


def differing_bytes(a: bytes, b: bytes) -> list[int]:
    """The first offsets where two objects differ (empty when they are the same bytes)."""
    if a == b:
        return []
    return [i for i in range(min(len(a), len(b))) if a[i] != b[i]][:16] or [min(len(a), len(b))]

class Audit:
    def __init__(self, cert_path: Path, store_dir: str | None, config: buildconfig.BuildConfig, doc: dict | None = None):
        """doc: a certificate document made now for what is built (``--built`` before `ninja` has
        written the certificate): audited the same way, with no build record to compare."""
        self.cert_path = cert_path
        self.doc, self.digest = (doc, None) if doc is not None else certificate.read(cert_path)
        self.store_problem = None
        try:
            self.store = Store(store_dir) if store_dir else None
        except StoreError as e:  # unusable store (read-only, no layout): objects that name an action fail below
            self.store, self.store_problem = None, str(e)
        self.config = config
        self.hasher = FileHasher()
        self.states = pathstates.States(self.hasher)
        self.failures: list[str] = []
        self.notes: list[str] = []
        self.per_object: list[tuple[str, str, str]] = []
        self.stale: list[str] = []  # outputs that compiling now would not give: --invalidate removes them
        self.unvouched: list[str] = []  # restored objects whose entry's signers are no longer trusted enough
        self.trust, self.trust_problem = _trust(config)

    def fail(self, what: str) -> None:
        self.failures.append(what)

    def note(self, what: str) -> None:
        """Said, not failed: what the audit could not cross-check beyond the certificate."""
        self.notes.append(what)

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
            if m.get("link_sha256") != m["sha256"]:
                self.fail(f"module {module}: sha256 {m['sha256']} is not what its link made "
                          f"({m['link_sha256']}), as the certificate says: run ninja: it relinks or restores it"
                          if m.get("link_sha256") else
                          f"module {module}: the certificate (format {self.doc.get('format')}) does not say what "
                          "its link made: run ninja: it relinks the module and writes the certificate again")
                self.stale.append(str(module))
                continue
            try:
                pin.check(module, sha)
            except pin.PinError as e:
                self.fail(str(e))
                self.stale.append(str(module))
                continue
            if m.get("link_inputs") is None:
                self.fail(f"module {module}: the certificate records no observation of its link (linked by an older "
                          "pp4): rebuild it")
                self.stale.append(str(module))
                continue
            if m.get("link_not_observed"):
                self.fail(f"module {module}: its link was not observed ({m['link_not_observed']}), so nothing "
                          "says what it was linked from")
                continue
            mounts = m.get("link_mounts")
            to_real = Root.from_mounts(mounts).real if mounts else (lambda path: path)
            changed = pathstates.differences(m["link_inputs"], to_real, self.states)
            if changed:
                self.fail(f"module {module}: changed since it was linked: " + "; ".join(changed[:5])
                          + (f"; and {len(changed) - 5} more" if len(changed) > 5 else ""))
                self.stale.append(str(module))

    def check_input_sets(self) -> dict[str, list[str]]:
        """Each observation set once: its name must be its content's hash."""
        return {sid: ([] if entries is not None and inputsets.set_id(entries) == sid
                      else [f"the certificate's input set {sid[:16]} does not hash to its name"])
                for sid, entries in self.doc.get("input_sets", {}).items()}

    def check_objects(self) -> None:
        set_problems = self.check_input_sets()
        for obj in self.doc["objects"]:
            problems = []
            sha = self.hasher.sha256(obj["output"])
            if sha != obj["object_sha256"]:
                problems.append(f"object sha256 is {sha}, certificate says {obj['object_sha256']}")
            if not obj.get("input_sets"):
                problems.append("the certificate records no observation of its compile ("
                                f"{obj.get('not_stored') or 'written by an older pp4'}): rebuild it")
            for sid in obj.get("input_sets", []):
                problems += set_problems.get(sid, [f"input set {sid[:16]} is not in the certificate"])
            if not problems:  # what the compile saw, against the machine now
                mapping = Root.from_mounts(obj["mounts"]) if obj.get("mounts") else None
                to_real = mapping.real if mapping is not None else (lambda p: p)
                for sid in obj["input_sets"]:
                    changed = pathstates.differences(self.doc["input_sets"][sid], to_real, self.states)
                    problems += [f"changed since it was built: {c}" for c in changed[:5]]
                    if len(changed) > 5:
                        problems.append(f"and {len(changed) - 5} more observations")
            if problems:
                self.stale.append(obj["output"])
            # The object is judged by the certificate (its bytes, its observations, its entry's
            # signatures as the certificate keeps them); the store only adds a cross-check, and an
            # entry it no longer holds (gc evicts by size) or a store that cannot be read is a note.
            if self.store is None and self.store_problem and obj.get("action_key"):
                self.note(f"{obj['output']}: action {obj['action_key'][:16]} not compared with the store: "
                          f"{self.store_problem}")
            problems += self.check_signatures(obj)
            if self.store is not None and obj.get("action_key"):
                record = self.store.lookup(obj["action_key"])
                if record is None:
                    if obj["status"] == "reused":
                        self.note(f"{obj['output']}: action {obj['action_key'][:16]} is no longer in the store "
                                  f"{self.store.root} (evicted since?); judged by the certificate alone")
                elif record.object_sha256 != obj["object_sha256"]:
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

    def check_signatures(self, obj: dict) -> list[str]:
        """A restored object's entry was signed by builders this build trusts (their signatures of
        its statement verify now, none of them revoked since); a compiled one that was stored names
        this builder's signature. Nothing for an object compiled and not stored."""
        if obj["status"] != "reused" and not obj.get("action_key"):
            return []
        signatures, payload = obj.get("signatures") or [], obj.get("signed_payload")
        if not signatures or payload is None:
            return [f"its entry carries no signature the certificate kept ({obj['status']})"]
        if self.trust is None:
            return [f"its signatures cannot be checked: {self.trust_problem}"]
        # A restored entry needs the signers the build requires; one compiled here, its builder's own.
        trust = self.trust if obj["status"] == "reused" else attrs.evolve(self.trust, require=1)
        verdict = trust.verdict(obj["action_key"], obj["object_sha256"], obj["object_size"], obj["input_sets"],
                                payload, signatures)
        if not verdict.ok and obj["status"] == "reused":
            self.unvouched.append(obj["output"])
        return [] if verdict.ok else [f"its entry's signatures do not hold now: {verdict.why}"]

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
            # Compiled here, in this build's root: the question is whether compiling now gives the
            # object used here. Only its outputs go elsewhere (an object does not name its own path).
            argv = list(obj["argv"])
            argv[argv.index("-o") + 1] = str(scratch / "recompiled.o")
            argv[argv.index("-MF") + 1] = str(scratch / "recompiled.o.d")
            reuse = self.config.reuse_config()
            root = Root.make(os.getcwd(), reuse.places, obj.get("root"), reuse.builddir()) if obj.get("mounts") else None
            t0 = time.monotonic()
            # Observed as the build's compiles are: the observer is one of the processes whose ids
            # the object records (pp4/execution/root.py).
            ran = run(argv, obj.get("env", {}), Limits.from_dict(self.config.limits), scratch / "runs", root)
            if ran.returncode != 0:
                self.fail(f"{obj['output']}: recompiling failed:\n{ran.stderr.decode(errors='replace')[-2000:]}")
                continue
            out = scratch / "recompiled.o"
            try:
                stored = self.store.object_bytes(record)
            except (CorruptObject, ObjectMissing) as e:
                self.fail(f"{obj['output']}: the stored object cannot be read to compare: {e}")
                continue
            diff = differing_bytes(stored, out.read_bytes())
            verdict = "identical, byte for byte" if not diff else f"DIFFERS at bytes {diff}"
            if diff:
                self.fail(f"{obj['output']}: recompiled object differs from the stored one at bytes {diff}")
            lines.append(f"  recompiled {obj['output']} in {time.monotonic() - t0:.1f} s: {verdict}")
        return lines


def _trust(config: buildconfig.BuildConfig):
    """The build's trust list (pp4/store/signing.py), as its restores used it: (trust, None) or
    (None, why it cannot be read)."""
    from pp4.store import signing

    settings = config.reuse_config().trust
    try:
        return signing.build_trust(settings), None
    except signing.SigningKeyError as e:
        return None, str(e)


@interrupt.command("pp4.certify.audit")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pp4.certify.audit", description="Audit a pp4 build against its certificate.")
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
        config = buildconfig.load(builddir)
        store_dir = args.store or config.store
        if args.built:
            built, not_built = certificate.built_targets(builddir, builddir / "actions.json")
            if not args.certificate.exists():
                if not built:
                    print("pp4.certify.audit: nothing is built yet, so nothing is certified: run `ninja` (every module) "
                          f"or `ninja TARGET` (one of {', '.join(not_built)})", file=sys.stderr)
                    return 1
                doc = certificate.document(builddir / "pp4.json", builddir / "actions.json", builddir, set(built))
        audit = Audit(args.certificate, store_dir, config, doc)
    except (certificate.CertificateError, pin.PinError, buildconfig.BuildFolderError, OSError, ValueError, KeyError) as e:
        print(f"pp4.certify.audit: error: {e}", file=sys.stderr)
        return 1
    audit.check_record()
    audit.check_objects()
    lines = []
    if args.recompile:
        with tempfile.TemporaryDirectory(dir=config.state_dir, prefix="recompile-") as tmp:
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
    print(f"  {counted(len(objs), 'object')}: {reused} reused, {len(objs) - reused} compiled, {failed} failed; "
          f"{counted(len(audit.doc['modules']), 'module')}; {inputs} files hashed in {time.monotonic() - t0:.2f} s "
          f"({time.process_time():.2f} CPU-s with start-up)")
    if not_built:
        print(f"  not built yet: {', '.join(not_built)} (`ninja TARGET` builds one; `ninja` builds and certifies all)")
    if args.objects:
        for status, out, detail in audit.per_object:
            print(f"  {status:8} {out}  {detail}")
    for line in lines:
        print(line)
    for n in audit.notes[:20]:
        print(f"  note: {n}")
    if len(audit.notes) > 20:
        print(f"  note: and {len(audit.notes) - 20} more")
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
                  f"exactly those: {sys.executable} -m pp4.certify.audit --invalidate {args.certificate} && ninja", file=sys.stderr)
        if audit.unvouched:
            print(f"{len(audit.unvouched)} restored object(s) were vouched for by keys this build no longer trusts "
                  "enough: run `ninja`, which compiles them (or restores them from entries still trusted), then "
                  "`ninja certify`", file=sys.stderr)
        return 1
    print("audit passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
