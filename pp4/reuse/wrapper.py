"""The reuse rule: skip a compile only when its action provably matches a stored one.

Two entry points, both run by ninja:

    python -m pp4.reuse CONFIG [--env NAME=VALUE]... -- COMPILER ARGS...   one compile (the rule's command)
    python -m pp4.reuse --prepass CONFIG ACTIONS STAMP                    all compiles of the build at once

The per-compile wrapper looks its action up (pp4.actionkey), and on a match materializes the stored
object, rechecks its hash and writes the complete dependency file for ninja; otherwise it compiles
under the configured limits and stores the object with its record. The prepass, which every compile
edge waits for, does the lookups of all compiles whose object is missing in one process, hashing
each input file once, and materializes the hits; each of those edges then only claims its object
(a marker the prepass left), which costs a shell `test`, not a Python start-up.

Every compile and every reuse writes an event (build/.pp4/events/) that the certificate collects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Callable
from pathlib import Path

import attrs

from pp4 import interrupt
from pp4.files import sha256_and_size
from pp4.reuse import actionkey, events, inputsets, relocate
from pp4.reuse.actionkey import CompileArgs
from pp4.reuse.basis import Basis
from pp4.reuse.launch import apply, command_for
from pp4.reuse.relocate import Relocation
from pp4.sources.extensions import may_be_shared
from pp4.store.local import Store
from pp4.store.manifests import Manifests
from pp4.store.records import CorruptObject, ObjectMissing, StoreError
from pp4.store.remote import RemoteUnavailable
from pp4.store.remote.tier import RemoteTier
from pp4.toolchain import compilerenv
from pp4.toolchain.compilers import CompilerError, Compilers
from pp4.toolchain.limits import Limits

MARKER_SUFFIX = ".pp4-reused"
MANIFEST_ENTRIES = 16  # most recent input sets kept per command
# A unit whose inputs name this macro embeds its source's mtime, which no key covers: never stored.
UNKEYED_MACROS = (b"__TIMESTAMP__",)


@attrs.frozen
class ReuseConfig:
    store: str | None  # None: reuse is off, every compile runs
    roots: tuple[str, ...]  # extension source roots, longest first
    erasable: tuple[str, ...]
    compilers: Compilers
    state_dir: str
    limits: Limits
    folded: dict  # the toolchain variables configure folded into build.ninja, as it saw them
    remote: dict | None = None  # {"url" (no password), "mode", "ttl"}: the remote tier, if any
    relocation: Relocation = Relocation()  # this machine's folders behind $TORCH, $TOOLCHAIN, ...
    executor: dict | None = None  # {"address", "timeout_s", "toolchain"}: misses compile on a Ray cluster

    @classmethod
    def load(cls, path: str | Path) -> "ReuseConfig":
        doc = json.loads(Path(path).read_text())
        r = doc["reuse"]
        return cls(store=r["store"], roots=tuple(sorted(r["roots"], key=len, reverse=True)),
                   erasable=tuple(r["erasable"]), compilers=Compilers.from_dict(doc["compile"]["compilers"]),
                   state_dir=r["state_dir"], limits=Limits.from_dict(doc["limits"]),
                   folded=doc["compile"].get("folded", {}), remote=r.get("remote"),
                   relocation=Relocation.from_dict(r.get("relocation")), executor=r.get("executor"))

    def tmpdir(self) -> Path:
        return Path(self.limits.tmpdir) if self.limits.tmpdir else Path(os.environ.get("TMPDIR", "/tmp"))

    def root_for(self, source: str) -> str | None:
        src = os.path.abspath(source)
        return next((r for r in self.roots if src.startswith(r + os.sep)), None)


@attrs.frozen
class Hit:
    entry: dict
    record: object  # pp4.store.ActionRecord
    tier: str = "local"  # "remote": fetched from the remote tier (checked) into the local store first


class Reuser:
    """Lookups and stores against one store, sharing one FileHasher (each file hashed once)."""

    def __init__(self, cfg: ReuseConfig):
        self.cfg = cfg
        self.basis = Basis(cfg.compilers, cfg.state_dir, cfg.tmpdir(), cfg.relocation)
        self.hasher = self.basis.hasher
        self.sets = self.basis.sets
        self.state_sets = inputsets.directory(cfg.state_dir)
        self._in_state: set[str] = set()  # sets this process made sure the build's state dir holds
        self.store_sets = inputsets.directory(cfg.store) if cfg.store else None
        self.manifests = Manifests(cfg.store) if cfg.store else None
        self.store_problem: str | None = None  # why a configured store cannot be used
        try:
            self.store = Store(cfg.store) if cfg.store else None
        except StoreError as e:  # e.g. a read-only or unwritable place with no store yet
            self.store = None
            self.store_problem = str(e)
            print(f"pp4.reuse: warning: {e} (building without reuse: every object is compiled, none stored)",
                  file=sys.stderr)
        # Remote hits are restored through the local store, so the tier needs one.
        self.remote = RemoteTier.from_config(cfg.remote, cfg.state_dir) if self.store is not None else None
        self._keys: dict[tuple, tuple] = {}

    # -- keys -------------------------------------------------------------------------------

    def identity(self, args: CompileArgs, env: dict[str, str]):
        return self.basis.identity(args, env)

    def keys(self, args: CompileArgs, env: dict[str, str]) -> tuple[str, str | None, list[str], dict]:
        """Manifest key, source root, normalized command, erased defines; computed once per command
        (a compile asks for them at lookup, at its lock and when it stores)."""
        key = (args.argv, tuple(sorted(env.items())))
        cached = self._keys.get(key)
        if cached is None:
            root = self.cfg.root_for(args.source)
            normalized, erased = actionkey.normalize(args, root, self.cfg.erasable)
            cwd = os.getcwd() if actionkey.embeds_cwd(args) else None
            portable = self.portable_for(args)
            normalized = relocate.without_repeated_maps([portable(a) for a in normalized])
            mkey = actionkey.manifest_key(normalized, self.identity(args, env).hashes, env, cwd)
            cached = self._keys[key] = (mkey, root, normalized, erased)
        return cached

    def portable_for(self, args: CompileArgs) -> Callable[[str], str]:
        """How keys and records name this compile's paths: this machine's torch, toolchain and
        Python folders by their placeholders, unless the object records absolute paths (debug
        information)."""
        return (lambda text: text) if actionkey.embeds_cwd(args) else self.cfg.relocation.portable

    # -- lookup -----------------------------------------------------------------------------

    def lookup(self, args: CompileArgs, env: dict[str, str]) -> Hit | None:
        """A stored object for this compile: the local store's, else one the remote tier holds."""
        if self.store is None:
            return None
        mkey, root, _, erased = self.keys(args, env)
        for entry in reversed(self.manifests.read(mkey)):
            if not sound_entry(mkey, entry):
                continue  # a damaged entry (the manifest's checksum is verify's, not read here): never trust it
            if not self._entry_matches(entry, args, env, root, erased):
                continue
            try:
                record = self.store.lookup(entry["action_key"])
            except StoreError as e:
                print(f"pp4.reuse: warning: {e} (compiling instead)", file=sys.stderr)
                return None
            if record is None:
                continue
            return Hit(entry, record)
        if self.remote is not None:
            try:
                return self._remote_lookup(args, env, mkey, root, erased)
            except RemoteUnavailable:
                self.remote = None  # said once (pp4/store/remote/tier.py); this process goes on locally
        return None

    def _entry_matches(self, entry: dict, args: CompileArgs, env: dict[str, str], root: str | None,
                       erased: dict) -> bool:
        """Whether a sound entry's inputs are this compile's: the same bytes, sets and probes."""
        if entry.get("uses_erasable") and entry.get("erased") != erased:
            return False  # an input mentions the module name or internals id: values must match
        if args.language == "cuda":  # the object may name where its source was (actionkey.names_its_source_path)
            if "source_realpath" not in entry:
                return False  # stored before pp4 checked: whether it names another folder is unknown
            if entry["source_realpath"] is not None and entry["source_realpath"] != os.path.realpath(args.source):
                return False
        own = [(actionkey.from_src(p, root), p, sha) for p, sha in entry["inputs"]]
        if any(self.hasher.sha256(p) != sha for p, _, sha in own):
            return False
        if not all(self.sets.matches(self.store_sets, sid) for sid in entry["input_sets"]):
            return False  # a shared header changed (or the set is gone or damaged)
        digest = self.basis.probe_digest(args, env, [(p, shown) for p, shown, _ in own], entry["input_sets"],
                                         self.store_sets)
        return digest == entry["probes"]  # else a file appeared or vanished where its include search looks

    def _remote_lookup(self, args: CompileArgs, env: dict[str, str], mkey: str, root: str | None,
                       erased: dict) -> Hit | None:
        """The remote tier's entries for this command, checked as local ones are; a match's record
        and object are checked again (pp4/store/remote/tier.py) and put into the local store,
        which then serves the hit."""
        remote = self.remote
        for entry in reversed(remote.entries(mkey)):
            if not sound_entry(mkey, entry):
                remote.refuse(f"man/{mkey}", "an entry whose action key does not follow from its inputs")
                continue
            for sid in entry["input_sets"]:
                if self.sets.load(self.store_sets, sid) is None:
                    data = remote.input_set(sid)
                    if data is None:
                        break
                    inputsets.write_canonical(self.store_sets, sid, data)
                    self.sets.forget(sid)
            if not self._entry_matches(entry, args, env, root, erased):
                continue
            akey = entry["action_key"]
            try:
                record = self.store.lookup(akey)
            except StoreError:
                record = None
            if record is None:
                fetched = remote.fetch(akey)
                if fetched is None:
                    continue
                record = self._fill_local(*fetched)
                if record is None:
                    return None
            self._add_to_manifest(mkey, entry)
            return Hit(entry, record, tier="remote")
        return None

    def _fill_local(self, record, blob: bytes):
        """Put a checked remote object into the local store; the record the local store keeps."""
        tmpdir = self.cfg.tmpdir()
        tmpdir.mkdir(parents=True, exist_ok=True)
        staged = tmpdir / f"remote-{record.object_sha256[:16]}-{os.getpid()}.o"
        try:
            staged.write_bytes(blob)
            payload = dict(record.payload, fetched_from=self.remote.describe())
            return self.store.put(record.action_key, staged, payload)
        except (OSError, StoreError) as e:
            print(f"pp4.reuse: warning: cannot keep the remote store's object in the local store ({e}); "
                  "compiling instead", file=sys.stderr)
            return None
        finally:
            staged.unlink(missing_ok=True)

    def materialize(self, hit: Hit, args: CompileArgs) -> bool:
        """Put the stored object at the output, rechecked, and the dependency file beside it."""
        root = self.cfg.root_for(args.source)
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            # A copy, not a hard link: a later compile writing to the output in place must never
            # reach the stored object through a shared inode.
            self.store.materialize(hit.record, out, allow_link=False)
        except (CorruptObject, ObjectMissing) as e:
            print(f"pp4.reuse: warning: {e}; compiling {args.output} instead", file=sys.stderr)
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

    def store_compile(self, args: CompileArgs, env: dict[str, str], started: float, duration: float) -> dict:
        """Store a fresh object. Returns the event fields: action key (None when not stored, with
        the reason), the own inputs with their hashes and the input sets, the probe digest, the
        object's sha256."""
        mkey, root, normalized, erased = self.keys(args, env)
        deps = [os.path.abspath(p) for p in actionkey.parse_depfile(Path(args.depfile).read_text())]
        hashes = [self.hasher.sha256(p) for p in deps]
        portable = self.portable_for(args)
        own, shared = inputsets.split([[portable(actionkey.to_src(p, root)), sha] for p, sha in zip(deps, hashes)])
        sid, set_bytes = inputsets.encode(shared)
        inputsets.write_canonical(self.state_sets, sid, set_bytes)
        sets = [sid]
        digest = self.basis.probe_digest(args, env, [(actionkey.from_src(p, root), p) for p, _ in own], sets, self.state_sets)
        sha, _ = sha256_and_size(args.output)
        toolchain = self.identity(args, env).hashes
        bound = actionkey.source_path_bound(args) if args.language == "cuda" else actionkey.NOT_CHECKED
        result = {"action_key": None, "inputs": own, "input_sets": sets, "probes": digest, "object_sha256": sha,
                  "not_stored": None, "env": env, "toolchain": toolchain}
        if bound is not actionkey.NOT_CHECKED:
            result["source_realpath"] = bound
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
        unkeyed = [(p, m.decode()) for p in deps for m in UNKEYED_MACROS if self.hasher.mentions(p, m)]
        if unkeyed:
            return dict(result, not_stored=f"{unkeyed[0][0]} uses {unkeyed[0][1]} (a file's modification time, "
                                           "which no key covers): this unit is compiled every time")
        uses = any(self.hasher.mentions(p, name.encode()) for p in deps for name in self.cfg.erasable)
        akey = actionkey.action_key(mkey, own, sets, erased if uses else None, digest, bound)
        payload = {"manifest_key": mkey, "command": normalized, "inputs": own, "input_sets": sets, "erased": erased,
                   "source_realpath": None if bound is actionkey.NOT_CHECKED else bound,
                   "uses_erasable": uses, "probes": digest, "toolchain": toolchain, "env": env,
                   "compiled_for": {"output": os.path.abspath(args.output), "root": root, "cwd": os.getcwd()},
                   "duration_s": round(duration, 3)}
        entry = {"action_key": akey, "inputs": own, "input_sets": sets, "probes": digest, "uses_erasable": uses,
                 "erased": erased if uses else None}
        if bound is not actionkey.NOT_CHECKED:
            entry["source_realpath"] = bound
        existing = self.store.lookup(akey)
        if existing is not None:
            # Its twin (the same unit of another variant) stored this action first. Both objects
            # are valid; they may differ in the source paths they embed (docs/reuse.md). The
            # manifest may lack the entry (a put killed before the manifest was written): add it.
            self._add_to_manifest(mkey, entry)
            self._publish(mkey, entry, {sid: set_bytes}, existing, args.output)
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
        return dict(result, action_key=akey, remote=self._publish(mkey, entry, {sid: set_bytes}, record, args.output))

    def _publish(self, mkey: str, entry: dict, sets: dict[str, bytes], record, output: str) -> str | None:
        """Send a stored compile to the remote tier (readwrite mode); where it went, for the event."""
        if self.remote is None or not self.remote.writes:
            return None
        ok = self.remote.publish(mkey, entry, sets, record, output,
                                 keep=lambda e: sound_entry(mkey, e) and e.get("action_key") != entry["action_key"])
        return self.remote.describe() if ok else None

    def _add_to_manifest(self, mkey: str, entry: dict) -> None:
        try:
            self.manifests.add(mkey, entry, MANIFEST_ENTRIES,
                               lambda e: sound_entry(mkey, e) and e.get("action_key") != entry["action_key"])
        except OSError as e:  # a full or read-only store: the object is stored, but not findable yet
            print(f"pp4.reuse: warning: cannot write the store's manifest {self.manifests.path(mkey)} "
                  f"({e.strerror}); this object will not be reused until it is compiled again with room "
                  "in the store", file=sys.stderr)

    @contextmanager
    def compile_lock(self, args: CompileArgs, env: dict[str, str]):
        """Held while compiling, per manifest key: the same unit of two variants in one build has one
        key, so the second waits for the first and then reuses its object when the rule allows.

        Waiting is a scheduling choice, never a correctness one (the lookup decides): it is skipped
        for units that visibly use the module name or pybind11, which can never be shared and would
        only serialize two long compiles. Yields True when it waited.
        """
        if self.store is None:
            yield False
            return
        with self.manifests.lock(self.keys(args, env)[0], lambda: may_be_shared(args.source)) as waited:
            yield waited

    # -- events -----------------------------------------------------------------------------

    def event_doc(self, args: CompileArgs, **fields) -> dict:
        root = self.cfg.root_for(args.source)
        return {"output": args.output, "source": os.path.abspath(args.source), "root": root, **fields}

    def event(self, args: CompileArgs, **fields) -> None:
        events.write(self.cfg.state_dir, args.output, self.event_doc(args, **fields))

    def hit_doc(self, args: CompileArgs, env: dict[str, str], hit: Hit, seconds: float, via: str) -> dict:
        payload = hit.record.payload
        if hit.tier == "remote":
            via += ", from the remote store"
        return self.event_doc(args, status="reused", via=via, tier=hit.tier,
                              fetched_from=payload.get("fetched_from") if hit.tier == "remote" else None,
                              action_key=hit.entry["action_key"],
                              object_sha256=hit.record.object_sha256, inputs=hit.entry["inputs"],
                              input_sets=hit.entry["input_sets"], probes=hit.entry["probes"],
                              reused_from=payload.get("compiled_for"), compile_duration_s=payload.get("duration_s"),
                              restore_duration_s=round(seconds, 4), toolchain=self.identity(args, env).hashes,
                              env=env, **({"source_realpath": hit.entry["source_realpath"]}
                                          if "source_realpath" in hit.entry else {}))

    def hit_event(self, args: CompileArgs, env: dict[str, str], hit: Hit, seconds: float, via: str) -> None:
        events.write(self.cfg.state_dir, args.output, self.hit_doc(args, env, hit, seconds, via))


def sound_entry(mkey: str, entry) -> bool:
    """Whether a manifest entry is well formed and its action key follows from its inputs: a flipped
    byte in a manifest must never lead the lookup to another action's object."""
    try:
        return (all(isinstance(p, str) and isinstance(h, str) for p, h in entry["inputs"])
                and all(isinstance(s, str) for s in entry["input_sets"])
                and isinstance(entry["probes"], str)
                and actionkey.action_key(mkey, entry["inputs"], entry["input_sets"], entry.get("erased"),
                                         entry["probes"], entry.get("source_realpath", actionkey.NOT_CHECKED))
                == entry["action_key"])
    except (TypeError, ValueError, KeyError, AttributeError):
        return False


# ---------------------------------------------------------------------------------------------
# one compile


def notify_once(cfg: ReuseConfig) -> None:
    """Print the toolchain variables set here that do not reach the compilers (pp4.compilerenv),
    once per ninja run: the first of its processes to claim the run prints them."""
    lines = compilerenv.notices(dict(os.environ), cfg.folded, "build")
    if not lines:
        return
    run = _ninja_run()
    if run is not None:
        marks = Path(cfg.state_dir) / "notices"
        try:
            marks.mkdir(parents=True, exist_ok=True)
            for old in marks.iterdir():  # runs that are over
                if not Path("/proc", old.name.split("-")[0]).exists():
                    old.unlink(missing_ok=True)
            os.close(os.open(marks / run, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        except OSError:
            pass
    for line in lines:
        print(f"pp4: notice: {line}", file=sys.stderr)


def _ninja_run() -> str | None:
    """pid-starttime of the ninja process this one runs under, if any."""
    pid = os.getppid()
    for _ in range(4):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if name == "ninja":
            return f"{pid}-{fields[19]}"
        pid = int(fields[1])
    return None


def compile_one(cfg: ReuseConfig, env: dict[str, str], argv: list[str]) -> int:
    args = actionkey.parse_compile(argv)
    marker = Path(args.output + MARKER_SUFFIX)
    if marker.exists():  # the prepass of this build restored it already
        marker.unlink()
        return 0
    notify_once(cfg)
    reuser = Reuser(cfg)
    t0 = time.monotonic()
    hit = reuser.lookup(args, env)
    if hit is not None and reuser.materialize(hit, args):
        reuser.hit_event(args, env, hit, time.monotonic() - t0, via="wrapper")
        reuser.basis.save()
        return 0
    with reuser.compile_lock(args, env) as waited:
        if waited:  # a twin (the other variant's same unit) was compiling: it may have stored ours
            hit = reuser.lookup(args, env)
            if hit is not None and reuser.materialize(hit, args):
                reuser.hit_event(args, env, hit, time.monotonic() - t0, via="wrapper, after its twin")
                reuser.basis.save()
                return 0
        return _compile(cfg, reuser, args, env, argv)


def _compile(cfg: ReuseConfig, reuser: Reuser, args: CompileArgs, env: dict[str, str], argv: list[str]) -> int:
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() or out.is_symlink():
        out.unlink()  # never write through a link that may share its inode with a stored object
    tmpdir = cfg.tmpdir()
    tmpdir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    cluster = None
    if cfg.executor:  # imported only then: every compile's wrapper starts without it
        from pp4.reuse.cluster.executor import ClusterExecutor

        cluster = ClusterExecutor.from_config(cfg.executor, cfg.relocation, cfg.state_dir)
    if cluster is not None:
        done = cluster.run(args, env, list(argv), cfg.root_for(args.source), reuser.identity(args, env).hashes,
                           cfg.compilers.to_dict(), cfg.limits, reuser.hasher.sha256)
        if done is not None:
            stored = reuser.store_compile(args, env, started, done.duration_s)
            reuser.event(args, status="compiled", compile_duration_s=done.duration_s, executed_on=done.node, **stored)
            reuser.basis.save()
            return 0
    t1 = time.monotonic()
    proc = subprocess.run(command_for(cfg.limits, list(argv)), env=compilerenv.process_env(env, tmpdir),
                          preexec_fn=lambda: apply(cfg.limits))
    duration = time.monotonic() - t1
    if proc.returncode != 0:
        return proc.returncode
    stored = reuser.store_compile(args, env, started, duration)
    reuser.event(args, status="compiled", compile_duration_s=round(duration, 3), **stored)
    reuser.basis.save()
    return 0


# ---------------------------------------------------------------------------------------------
# the prepass


def prepass(cfg: ReuseConfig, actions_file: Path, stamp: Path) -> int:
    t0, cpu0 = time.monotonic(), time.process_time()
    actions = json.loads(actions_file.read_text())["actions"]
    notify_once(cfg)
    reuser = Reuser(cfg)
    restored = checked = 0
    hits: dict[str, dict] = {}
    for action in actions:
        args = actionkey.parse_compile(action["argv"])
        env = action["env"]
        marker = Path(args.output + MARKER_SUFFIX)
        if marker.exists():  # restored by an earlier prepass that never got claimed: start over
            for p in (marker, Path(args.output), Path(args.depfile)):
                p.unlink(missing_ok=True)
        if Path(args.output).exists():
            continue  # ninja decides about existing objects; their edges run the full wrapper
        checked += 1
        t = time.monotonic()
        hit = reuser.lookup(args, env)
        if hit is not None and reuser.materialize(hit, args):
            marker.write_text(hit.entry["action_key"] + "\n")
            hits[args.output] = reuser.hit_doc(args, env, hit, time.monotonic() - t, via="prepass")
            restored += 1
    reuser.basis.save()
    # One batch file for all of them, after the markers: killed before it is in place, the markers
    # make the next prepass restore those objects again (pp4/reuse/events.py).
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
        remote = sum(doc.get("tier") == "remote" for doc in hits.values())
        print(f"pp4.reuse: {restored} of {checked} missing objects restored from the store"
              + (f" ({remote} from the remote store)" if remote else "")
              + f" in {time.monotonic() - t0:.2f} s ({cpu:.2f} CPU-s)")
    return 0


@interrupt.command("pp4.reuse")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "--prepass":
            if len(argv) != 4:
                print("usage: python -m pp4.reuse --prepass CONFIG ACTIONS STAMP", file=sys.stderr)
                return 2
            return prepass(ReuseConfig.load(argv[1]), Path(argv[2]), Path(argv[3]))
        env, rest = compilerenv.parse_env_args(argv[1:])
        if not argv or len(rest) < 2 or rest[0] != "--":
            print("usage: python -m pp4.reuse CONFIG [--env NAME=VALUE]... -- COMPILER ARGS...", file=sys.stderr)
            return 2
        if "PATH" not in env:
            print("pp4.reuse: error: no --env PATH=...: a compile runs only in the environment configure chose; "
                  "run it as build.ninja does, with the action's \"env\" from actions.json as --env NAME=VALUE",
                  file=sys.stderr)
            return 2
        return compile_one(ReuseConfig.load(argv[0]), env, rest[1:])
    except (actionkey.CommandError, CompilerError) as e:
        print(f"pp4.reuse: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
