"""The reuse rule: skip a compile only when its action provably matches a stored one.

Two entry points, both run by ninja:

    python -m pp4.reuse CONFIG -- COMPILER ARGS...          one compile (the rule's command)
    python -m pp4.reuse --prepass CONFIG ACTIONS STAMP      all compiles of the build at once

The per-compile wrapper looks its action up (pp4.actionkey), and on a match materializes the stored
object, rechecks its hash and writes the complete dependency file for ninja; otherwise it compiles
under the configured limits and stores the object with its record. The prepass, which every compile
edge waits for, does the lookups of all compiles whose object is missing in one process, hashing
each input file once, and materializes the hits; each of those edges then only claims its object
(a marker the prepass left), which costs a shell `test`, not a Python start-up.

Every compile and every reuse writes an event (build/.pp4/events/) that the certificate collects.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import attrs

from pp4 import actionkey, events, inputsets
from pp4.actionkey import CompileArgs, FileHasher
from pp4.compilerenv import compiler_env
from pp4.launch import Limits, apply, command_for
from pp4.store import CorruptObject, ObjectMissing, Store, StoreError, hash_file

MARKER_SUFFIX = ".pp4-reused"
MANIFEST_ENTRIES = 16  # most recent input sets kept per command


@attrs.frozen
class ReuseConfig:
    store: str | None  # None: reuse is off, every compile runs
    roots: tuple[str, ...]  # extension source roots, longest first
    erasable: tuple[str, ...]
    toolchain: dict
    state_dir: str
    limits: Limits

    @classmethod
    def load(cls, path: str | Path) -> "ReuseConfig":
        doc = json.loads(Path(path).read_text())
        r = doc["reuse"]
        return cls(store=r["store"], roots=tuple(sorted(r["roots"], key=len, reverse=True)),
                   erasable=tuple(r["erasable"]), toolchain=r["toolchain"], state_dir=r["state_dir"],
                   limits=Limits.from_dict(doc["limits"]))

    def root_for(self, source: str) -> str | None:
        src = os.path.abspath(source)
        return next((r for r in self.roots if src.startswith(r + os.sep)), None)


@attrs.frozen
class Hit:
    entry: dict
    record: object  # pp4.store.ActionRecord


class Reuser:
    """Lookups and stores against one store, sharing one FileHasher (each file hashed once)."""

    def __init__(self, cfg: ReuseConfig, env: dict[str, str] | None = None):
        self.cfg = cfg
        self.hasher = FileHasher()
        self.sets = inputsets.SetChecker(self.hasher)
        self.state_sets = inputsets.directory(cfg.state_dir)
        self._in_state: set[str] = set()  # sets this process made sure the build's state dir holds
        self.store_sets = inputsets.directory(cfg.store) if cfg.store else None
        self.store_problem: str | None = None  # why a configured store cannot be used
        try:
            self.store = Store(cfg.store) if cfg.store else None
        except StoreError as e:  # e.g. a read-only or unwritable place with no store yet
            self.store = None
            self.store_problem = str(e)
            print(f"pp4.reuse: warning: {e} (building without reuse: every object is compiled, none stored)",
                  file=sys.stderr)
        env = os.environ if env is None else env
        host = actionkey.host_compiler_identity(Path(cfg.state_dir) / "host-compiler.json")
        self.toolchain_id = {"nvcc": cfg.toolchain, "host": host}
        self.env_id = actionkey.output_env(dict(env))
        self._keys: dict[tuple[str, ...], tuple] = {}

    # -- keys -------------------------------------------------------------------------------

    def keys(self, args: CompileArgs) -> tuple[str, str | None, list[str], dict]:
        """Manifest key, source root, normalized command, erased defines; computed once per command
        (a compile asks for them at lookup, at its lock and when it stores)."""
        cached = self._keys.get(args.argv)
        if cached is None:
            root = self.cfg.root_for(args.source)
            normalized, erased = actionkey.normalize(args, root, self.cfg.erasable)
            mkey = actionkey.manifest_key(normalized, self.toolchain_id, self.env_id)
            cached = self._keys[args.argv] = (mkey, root, normalized, erased)
        return cached

    def _manifest_path(self, mkey: str) -> Path:
        return Path(self.cfg.store) / "manifests" / mkey[:2] / f"{mkey}.json"

    def _read_manifest(self, mkey: str) -> list[dict]:
        try:
            doc = json.loads(self._manifest_path(mkey).read_text())
            entries = doc["entries"] if doc.get("manifest_key") == mkey else []
            return entries if isinstance(entries, list) else []
        except (OSError, ValueError, KeyError, TypeError):
            return []  # missing or damaged: a miss, never trusted

    # -- lookup -----------------------------------------------------------------------------

    def lookup(self, args: CompileArgs) -> Hit | None:
        if self.store is None:
            return None
        mkey, root, _, erased = self.keys(args)
        for entry in reversed(self._read_manifest(mkey)):
            if not sound_entry(mkey, entry):
                continue  # a damaged manifest entry (manifests have no checksum): never trust it
            if entry.get("uses_erasable") and entry.get("erased") != erased:
                continue  # an input mentions the module name or internals id: values must match
            own = [(actionkey.from_src(p, root), sha) for p, sha in entry["inputs"]]
            if any(self.hasher.sha256(p) != sha for p, sha in own):
                continue
            if not all(self.sets.matches(self.store_sets, sid) for sid in entry["input_sets"]):
                continue  # a shared header changed (or the set is gone or damaged)
            recorded = {actionkey.from_src(p, root) for p in entry.get("shadows", [])}
            now = set(self.sets.finder(args.search_dirs).candidates([p for p, _ in own]))
            for sid in entry["input_sets"]:
                now.update(self.sets.shadows(self.store_sets, sid, args.search_dirs))
            if any(c not in recorded for c in now):
                continue  # a header appeared that the compiler would now find first
            try:
                record = self.store.lookup(entry["action_key"])
            except StoreError as e:
                print(f"pp4.reuse: warning: {e} (compiling instead)", file=sys.stderr)
                return None
            if record is None:
                continue
            return Hit(entry, record)
        return None

    def materialize(self, hit: Hit, args: CompileArgs) -> bool:
        """Put the stored object at the output, rechecked, and the dependency file beside it."""
        root = self.cfg.root_for(args.source)
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            # A copy, not a hard link: a later compile writing to the output in place must never
            # reach the stored object through a shared inode.
            self.store.materialize(hit.record, out, allow_link=False)
        except (CorruptObject, ObjectMissing):
            return False
        deps = [actionkey.from_src(p, root) for p, _ in hit.entry["inputs"]]
        bodies = []
        for sid in hit.entry["input_sets"]:
            bodies.append(self.sets.depfile_body(self.store_sets, sid))
            if sid not in self._in_state:  # the build's own copy, for its events and certificate
                self.sets.copy(self.store_sets, sid, self.state_sets)
                self._in_state.add(sid)
        Path(args.depfile).write_text(actionkey.format_depfile(args.output, deps, bodies))
        return True

    # -- store ------------------------------------------------------------------------------

    def store_compile(self, args: CompileArgs, started: float, duration: float) -> dict:
        """Store a fresh object. Returns the event fields: action key (None when not stored, with
        the reason), the own inputs with their hashes and the input sets, the object's sha256."""
        mkey, root, normalized, erased = self.keys(args)
        deps = [os.path.abspath(p) for p in actionkey.parse_depfile(Path(args.depfile).read_text())]
        hashes = [self.hasher.sha256(p) for p in deps]
        own, shared = inputsets.split([[actionkey.to_src(p, root), sha] for p, sha in zip(deps, hashes)])
        sid, set_bytes = inputsets.encode(shared)
        inputsets.write_canonical(self.state_sets, sid, set_bytes)
        sets = [sid]
        sha, _ = hash_file(args.output)
        result = {"action_key": None, "inputs": own, "input_sets": sets, "object_sha256": sha, "not_stored": None}
        if self.store is None:
            return dict(result, not_stored=self.store_problem or "reuse is off")
        for p, h in zip(deps, hashes):
            if h is None:
                return dict(result, not_stored=f"{p} cannot be read")
            try:
                if os.stat(p).st_mtime >= started - 0.01:
                    return dict(result, not_stored=f"{p} changed while it was being compiled")
            except OSError:
                return dict(result, not_stored=f"{p} vanished during the compile")
        uses = any(self.hasher.mentions(p, name.encode()) for p in deps for name in self.cfg.erasable)
        akey = actionkey.action_key(mkey, own, sets, erased if uses else None)
        shadows = [actionkey.to_src(c, root) for c in self.sets.finder(args.search_dirs).candidates(deps)]
        payload = {"manifest_key": mkey, "command": normalized, "inputs": own, "input_sets": sets, "erased": erased,
                   "uses_erasable": uses, "shadows": shadows, "toolchain": self.toolchain_id,
                   "compiled_for": {"output": os.path.abspath(args.output), "root": root},
                   "duration_s": round(duration, 3)}
        entry = {"action_key": akey, "inputs": own, "input_sets": sets, "shadows": shadows, "uses_erasable": uses,
                 "erased": erased if uses else None}
        existing = self.store.lookup(akey)
        if existing is not None:
            # Its twin (the same unit of another variant) stored this action first. Both objects
            # are valid; they may differ in the source paths they embed (docs/reuse.md). The
            # manifest may lack the entry (a put killed before the manifest was written): add it.
            self._add_to_manifest(mkey, entry)
            twin = (existing.payload.get("compiled_for") or {}).get("output")
            return dict(result, not_stored=f"the store already holds this action's object, compiled for {twin}")
        try:
            # the set first: an entry or record must never name a set the store lacks
            inputsets.write_canonical(self.store_sets, sid, set_bytes)
        except OSError as e:
            print(f"pp4.reuse: warning: cannot write an input set into the store ({e.strerror}); "
                  "the object was built, it is just not stored", file=sys.stderr)
            return dict(result, not_stored=f"cannot write its input set ({e.strerror})")
        try:
            record = self.store.put(akey, args.output, payload)
        except StoreError as e:
            print(f"pp4.reuse: warning: {e} (the object was built; it is just not stored)", file=sys.stderr)
            return dict(result, not_stored=str(e))
        if record.object_sha256 != sha:
            return dict(result, not_stored="the object changed while it was being stored")
        self._add_to_manifest(mkey, entry)
        return dict(result, action_key=akey)

    def _add_to_manifest(self, mkey: str, entry: dict) -> None:
        path = self._manifest_path(mkey)
        entries = [e for e in self._read_manifest(mkey)
                   if sound_entry(mkey, e) and e.get("action_key") != entry["action_key"]]
        entries = (entries + [entry])[-MANIFEST_ENTRIES:]
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"manifest_key": mkey, "entries": entries}))
            os.replace(tmp, path)  # two writers at once: one entry may be lost, which is only a future miss
        except OSError as e:  # a full or read-only store: the object is stored, but not findable yet
            tmp.unlink(missing_ok=True)
            print(f"pp4.reuse: warning: cannot write the store's manifest {path} ({e.strerror}); "
                  f"this object will not be reused until it is compiled again with room in the store",
                  file=sys.stderr)

    @contextmanager
    def compile_lock(self, args: CompileArgs):
        """Held while compiling, per manifest key: the same unit of two variants in one build has one
        key, so the second waits for the first and then reuses its object when the rule allows.

        Waiting is a scheduling choice, never a correctness one (the lookup decides): it is skipped
        for units that visibly use the module name or pybind11, which can never be shared and would
        only serialize two long compiles. Yields True when it waited.
        """
        if self.store is None:
            yield False
            return
        mkey = self.keys(args)[0]
        path = Path(self.cfg.store) / "locks" / mkey[:2] / mkey
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            f = open(path, "a+")
        except OSError:  # a read-only or full store: compile without coordinating
            yield False
            return
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                waited = False
            except BlockingIOError:
                if not worth_waiting(args.source):
                    yield False
                    return
                fcntl.flock(f, fcntl.LOCK_EX)
                waited = True
            try:
                yield waited
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # -- events -----------------------------------------------------------------------------

    def event_doc(self, args: CompileArgs, **fields) -> dict:
        root = self.cfg.root_for(args.source)
        return {"output": args.output, "source": os.path.abspath(args.source), "root": root, **fields}

    def event(self, args: CompileArgs, **fields) -> None:
        events.write(self.cfg.state_dir, args.output, self.event_doc(args, **fields))

    def hit_doc(self, args: CompileArgs, hit: Hit, seconds: float, via: str) -> dict:
        payload = hit.record.payload
        return self.event_doc(args, status="reused", via=via, action_key=hit.entry["action_key"],
                              object_sha256=hit.record.object_sha256, inputs=hit.entry["inputs"],
                              input_sets=hit.entry["input_sets"],
                              reused_from=payload.get("compiled_for"), compile_duration_s=payload.get("duration_s"),
                              restore_duration_s=round(seconds, 4), toolchain=self.toolchain_id)

    def hit_event(self, args: CompileArgs, hit: Hit, seconds: float, via: str) -> None:
        events.write(self.cfg.state_dir, args.output, self.hit_doc(args, hit, seconds, via))


def verify_manifests(store_root: Path, repair: bool) -> list[tuple[str, str, bool]]:
    """Damage in the store's manifests: (path, what is wrong, repaired). Repair drops the entries
    whose action key does not follow from their inputs, and removes unreadable manifests."""
    damage = []
    for path in sorted((Path(store_root) / "manifests").glob("*/*.json")):
        mkey = path.stem
        try:
            doc = json.loads(path.read_text())
            entries = doc["entries"]
            if doc.get("manifest_key") != mkey or not isinstance(entries, list):
                raise ValueError("its manifest key or entry list is wrong")
        except (OSError, ValueError, KeyError, TypeError) as e:
            if repair:
                path.unlink(missing_ok=True)
            damage.append((str(path), f"unreadable manifest ({e})", repair))
            continue
        good = [e for e in entries if sound_entry(mkey, e)]
        if len(good) == len(entries):
            continue
        if repair:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"manifest_key": mkey, "entries": good}))
            os.replace(tmp, path)
        damage.append((str(path), f"{len(entries) - len(good)} entries whose action key does not follow from "
                                  "their inputs", repair))
    return damage


def sound_entry(mkey: str, entry) -> bool:
    """Whether a manifest entry is well formed and its action key follows from its inputs: a flipped
    byte in a manifest must never lead the lookup to another action's object."""
    try:
        return (all(isinstance(p, str) and isinstance(h, str) for p, h in entry["inputs"])
                and all(isinstance(s, str) for s in entry["input_sets"])
                and all(isinstance(p, str) for p in entry.get("shadows", []))
                and actionkey.action_key(mkey, entry["inputs"], entry["input_sets"], entry.get("erased"))
                == entry["action_key"])
    except (TypeError, ValueError, KeyError, AttributeError):
        return False


def worth_waiting(source: str) -> bool:
    """Could this unit be shared between variants? A cheap look at its own text, for scheduling only."""
    try:
        text = Path(source).read_bytes()
    except OSError:
        return False
    return not any(w in text for w in (b"TORCH_EXTENSION_NAME", b"pybind11", b"torch/extension.h", b"torch/python.h"))


# ---------------------------------------------------------------------------------------------
# one compile


def compile_one(cfg: ReuseConfig, argv: list[str]) -> int:
    args = actionkey.parse_compile(argv)
    marker = Path(args.output + MARKER_SUFFIX)
    if marker.exists():  # the prepass of this build restored it already
        marker.unlink()
        return 0
    reuser = Reuser(cfg)
    t0 = time.monotonic()
    hit = reuser.lookup(args)
    if hit is not None and reuser.materialize(hit, args):
        reuser.hit_event(args, hit, time.monotonic() - t0, via="wrapper")
        return 0
    with reuser.compile_lock(args) as waited:
        if waited:  # a twin (the other variant's same unit) was compiling: it may have stored ours
            hit = reuser.lookup(args)
            if hit is not None and reuser.materialize(hit, args):
                reuser.hit_event(args, hit, time.monotonic() - t0, via="wrapper, after its twin")
                return 0
        return _compile(cfg, reuser, args, argv)


def _compile(cfg: ReuseConfig, reuser: Reuser, args: CompileArgs, argv: list[str]) -> int:
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() or out.is_symlink():
        out.unlink()  # never write through a link that may share its inode with a stored object
    tmpdir = Path(cfg.limits.tmpdir) if cfg.limits.tmpdir else Path(os.environ.get("TMPDIR", "/tmp"))
    tmpdir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    t1 = time.monotonic()
    proc = subprocess.run(command_for(cfg.limits, list(argv)), env=compiler_env(tmpdir),
                          preexec_fn=lambda: apply(cfg.limits))
    duration = time.monotonic() - t1
    if proc.returncode != 0:
        return proc.returncode
    stored = reuser.store_compile(args, started, duration)
    reuser.event(args, status="compiled", compile_duration_s=round(duration, 3), toolchain=reuser.toolchain_id,
                 **stored)
    return 0


# ---------------------------------------------------------------------------------------------
# the prepass


def prepass(cfg: ReuseConfig, actions_file: Path, stamp: Path) -> int:
    t0, cpu0 = time.monotonic(), time.process_time()
    actions = json.loads(actions_file.read_text())["actions"]
    reuser = Reuser(cfg)
    restored = checked = 0
    hits: dict[str, dict] = {}
    for action in actions:
        args = actionkey.parse_compile(action["argv"])
        marker = Path(args.output + MARKER_SUFFIX)
        if marker.exists():  # restored by an earlier prepass that never got claimed: start over
            for p in (marker, Path(args.output), Path(args.depfile)):
                p.unlink(missing_ok=True)
        if Path(args.output).exists():
            continue  # ninja decides about existing objects; their edges run the full wrapper
        checked += 1
        t = time.monotonic()
        hit = reuser.lookup(args)
        if hit is not None and reuser.materialize(hit, args):
            marker.write_text(hit.entry["action_key"] + "\n")
            hits[args.output] = reuser.hit_doc(args, hit, time.monotonic() - t, via="prepass")
            restored += 1
    # One batch file for all of them, after the markers: killed before it is in place, the markers
    # make the next prepass restore those objects again (pp4/events.py).
    batch = events.write_batch(cfg.state_dir, hits)
    # The stamp's dependencies: every input of every compile seen so far, so that an edit of any of
    # them runs the prepass again before the compiles that ninja will then find out of date.
    deps: set[str] = set()
    set_ids: set[str] = set()
    known = events.Events(cfg.state_dir, batch)
    for action in actions:
        doc = known.get(action["output"])
        if not isinstance(doc, dict):
            continue
        deps.update(actionkey.from_src(p, doc.get("root")) for p, _ in doc.get("inputs", []))
        set_ids.update(doc.get("input_sets", []))
    for sid in set_ids:
        deps.update(reuser.sets.paths(reuser.state_sets, sid))
    stamp.parent.mkdir(parents=True, exist_ok=True)
    Path(str(stamp) + ".d").write_text(actionkey.format_depfile(str(stamp), sorted(deps)))
    cpu = time.process_time() - cpu0
    stamp.write_text(json.dumps({"checked": checked, "restored": restored,
                                 "seconds": round(time.monotonic() - t0, 3), "cpu_seconds": round(cpu, 3),
                                 "input_sets": reuser.sets.loaded()}) + "\n")
    if checked:
        print(f"pp4.reuse: {restored} of {checked} missing objects restored from the store "
              f"in {time.monotonic() - t0:.2f} s ({cpu:.2f} CPU-s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "--prepass":
            if len(argv) != 4:
                print("usage: python -m pp4.reuse --prepass CONFIG ACTIONS STAMP", file=sys.stderr)
                return 2
            return prepass(ReuseConfig.load(argv[1]), Path(argv[2]), Path(argv[3]))
        if len(argv) < 3 or argv[1] != "--":
            print("usage: python -m pp4.reuse CONFIG -- COMPILER ARGS...", file=sys.stderr)
            return 2
        return compile_one(ReuseConfig.load(argv[0]), argv[2:])
    except actionkey.CommandError as e:
        print(f"pp4.reuse: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
