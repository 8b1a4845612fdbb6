"""The reuse rule: skip a compile only when everything it observed last time holds now.

Two entry points, both run by ninja:

    python -m pp4.reuse CONFIG [--env NAME=VALUE]... -- COMPILER ARGS...   one compile (the rule's command)
    python -m pp4.reuse --prepass CONFIG ACTIONS STAMP                    all compiles of the build at once

A compile runs in the fixed execution root, observed (pp4/execution/). Its *manifest key* is the
hash of the command as it runs there (fixed paths, `-D` values as written) and its environment;
its *observation set* is every path its processes asked about with the state found there
(pp4/reuse/observed.py); the *action key* (manifest key + the set's name) names the stored object.
A lookup takes the manifest's entries newest first and restores the first whose every observation
holds now, then writes the dependency file from the set's files. Otherwise the unit compiles and is
stored, unless it cannot be trusted: not observed, an input changed while it ran, it wrote outside
its outputs, or gcc says its preprocessing expanded a time macro that SOURCE_DATE_EPOCH does not
fix (pp4/execution/run.py).

The prepass, which every compile edge waits for, does the lookups of all compiles whose object is
missing in one process (each path's state worked out once) and restores the hits; each of those
edges then only claims its object (a marker the prepass left), which costs a shell `test`, not a
Python start-up. Every compile and every reuse writes an event (build/.pp4/events/) that the
certificate collects.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import attrs

from pp4 import interrupt
from pp4.execution import depfile
from pp4.execution.root import Root
from pp4.execution.run import Ran, run
from pp4.files import canonical_json, sha256_and_size
from pp4.reuse import actionkey, events, inputsets, observed
from pp4.reuse.actionkey import CompileArgs, FileHasher
from pp4.store.local import Store
from pp4.store.manifests import Manifests
from pp4.store.records import CorruptObject, ObjectMissing, StoreError
from pp4.store.remote import RemoteUnavailable
from pp4.store.remote.tier import RemoteTier
from pp4.toolchain import compilerenv
from pp4.toolchain.compilers import CompilerError, Compilers
from pp4.toolchain.limits import Limits

MARKER_SUFFIX = ".pp4-reused"
MANIFEST_ENTRIES = 16  # most recent observation sets kept per command
KEY_FORMAT = 4  # 4: keyed on the command as it runs in the fixed root and on observed inputs


@attrs.frozen
class ReuseConfig:
    store: str | None  # None: reuse is off, every compile runs
    roots: tuple[str, ...]  # extension source roots, longest first
    compilers: Compilers
    state_dir: str
    limits: Limits
    folded: dict  # the toolchain variables configure folded into build.ninja, as it saw them
    remote: dict | None = None  # {"url" (no password), "mode", "ttl"}: the remote tier, if any
    places: dict = attrs.field(factory=dict)  # {"$TORCH": folder, ...}: mounted at fixed paths in the root
    executor: dict | None = None  # {"address", "timeout_s", "toolchain"}: misses compile on a Ray cluster

    @classmethod
    def load(cls, path: str | Path) -> "ReuseConfig":
        doc = json.loads(Path(path).read_text())
        r = doc["reuse"]
        return cls(store=r["store"], roots=tuple(sorted(r["roots"], key=len, reverse=True)),
                   compilers=Compilers.from_dict(doc["compile"]["compilers"]),
                   state_dir=r["state_dir"], limits=Limits.from_dict(doc["limits"]),
                   folded=doc["compile"].get("folded", {}), remote=r.get("remote"),
                   places=r.get("relocation") or {}, executor=r.get("executor"))

    def tmpdir(self) -> Path:
        return Path(self.limits.tmpdir) if self.limits.tmpdir else Path(os.environ.get("TMPDIR", "/tmp"))

    def runs_dir(self) -> Path:
        """Where each compile's scratch folder (its temporary folder, its trace) is made."""
        return self.tmpdir() / "pp4-runs"

    def builddir(self) -> str:
        return str(Path(self.state_dir).parent)

    def root_for(self, source: str) -> str | None:
        src = os.path.abspath(source)
        return next((r for r in self.roots if src.startswith(r + os.sep)), None)


@attrs.frozen
class Action:
    """One compile as the reuse rule sees it."""
    args: CompileArgs
    env: dict
    root: Root | None  # the fixed root it runs in; None where namespaces cannot be made here
    command: tuple[str, ...]  # as it runs: the root's paths, `-D` values as written
    mkey: str

    def outputs(self) -> set[str]:
        """The paths it writes, as it sees them."""
        fix = self.root.fixed if self.root is not None else (lambda p: p)
        cwd = self.root.cwd if self.root is not None else os.getcwd()
        return {os.path.normpath(os.path.join(cwd, fix(os.path.abspath(p)))) for p in (self.args.output, self.args.depfile)}


def manifest_key(command, env: dict[str, str], in_root: bool) -> str:
    doc = {"format": KEY_FORMAT, "argv": list(command), "env": env, "root": in_root}
    return hashlib.sha256(canonical_json(doc)).hexdigest()


def action_key(mkey: str, input_sets: list[str]) -> str:
    return hashlib.sha256(canonical_json({"manifest": mkey, "observed": input_sets})).hexdigest()


def sound_entry(mkey: str, entry) -> bool:
    """Whether a manifest entry is well formed and its action key follows from it: a flipped byte
    in a manifest must never lead the lookup to another action's object."""
    try:
        sets = entry["input_sets"]
        return (isinstance(sets, list) and len(sets) > 0 and all(isinstance(s, str) for s in sets)
                and sets == sorted(set(sets)) and action_key(mkey, sets) == entry["action_key"])
    except (TypeError, ValueError, KeyError, AttributeError):
        return False


@attrs.frozen
class Hit:
    entry: dict
    record: object  # pp4.store.ActionRecord
    tier: str = "local"  # "remote": fetched from the remote tier (checked) into the local store first


class Reuser:
    """Lookups and stores against one store; each path's state worked out once per process."""

    def __init__(self, cfg: ReuseConfig):
        self.cfg = cfg
        self.hasher = FileHasher(Path(cfg.state_dir) / "hashes.json")
        self.states = observed.States(self.hasher)
        self.sets = inputsets.SetChecker(self.states)
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
        self._root_ok: bool | None = None
        self.root_problem: str | None = None  # why compiles cannot run in the fixed root here
        self.missed: str | None = None  # why the last lookup's newest entry did not hold

    # -- the action -------------------------------------------------------------------------

    def root_works(self) -> bool:
        if self._root_ok is None:
            from pp4.execution.root import unavailable

            self.root_problem = unavailable(str(self.cfg.runs_dir()))
            self._root_ok = self.root_problem is None
        return self._root_ok

    def action(self, args: CompileArgs, env: dict[str, str]) -> Action:
        root = None
        if self.root_works():
            root = Root.make(os.getcwd(), self.cfg.places, self.cfg.root_for(args.source), self.cfg.builddir())
        command = tuple(root.command(list(args.argv)) if root is not None else args.argv)
        return Action(args, env, root, command, manifest_key(command, env, root is not None))

    # -- lookup -----------------------------------------------------------------------------

    def lookup(self, action: Action) -> Hit | None:
        """A stored object for this compile: the local store's, else one the remote tier holds."""
        if self.store is None:
            return None
        self.missed = None
        for entry in reversed(self.manifests.read(action.mkey)):
            if not sound_entry(action.mkey, entry) or not self.entry_holds(entry, action):
                self.note_miss(entry, action)
                continue
            try:
                record = self.store.lookup(entry["action_key"])
            except StoreError as e:
                print(f"pp4.reuse: warning: {e} (compiling instead)", file=sys.stderr)
                return None
            if record is not None:
                return Hit(entry, record)
        if self.remote is not None:
            try:
                return self._remote_lookup(action)
            except RemoteUnavailable:
                self.remote = None  # said once (pp4/store/remote/tier.py); this process goes on locally
        return None

    def entry_holds(self, entry: dict, action: Action) -> bool:
        return all(self.sets.matches(self.store_sets, sid, action.root) for sid in entry["input_sets"])

    def note_miss(self, entry: dict, action: Action) -> None:
        """Why the newest stored entry of this command did not hold, for the compile's event: the
        first question of someone whose build compiled what they expected restored."""
        if self.missed is not None:
            return
        if not sound_entry(action.mkey, entry):
            self.missed = "its newest stored entry is damaged"
            return
        to_real = action.root.real if action.root is not None else (lambda p: p)
        for sid in entry["input_sets"]:
            pairs = self.sets.load(self.store_sets, sid)
            if pairs is None:
                self.missed = f"its newest stored entry names an observation set the store lacks ({sid[:16]})"
                return
            changed = observed.differences(pairs, to_real, self.states)
            if changed:
                self.missed = f"{changed[0]} (and {len(changed) - 1} more)" if len(changed) > 1 else changed[0]
                return

    def _remote_lookup(self, action: Action) -> Hit | None:
        """The remote tier's entries for this command, checked as local ones are; a match's record
        and object are checked again (pp4/store/remote/tier.py) and put into the local store,
        which then serves the hit."""
        remote = self.remote
        for entry in reversed(remote.entries(action.mkey)):
            if not sound_entry(action.mkey, entry):
                remote.refuse(f"man/{action.mkey}", "an entry whose action key does not follow from its observations")
                continue
            for sid in entry["input_sets"]:
                if self.sets.load(self.store_sets, sid) is None:
                    data = remote.input_set(sid)
                    if data is None:
                        break
                    inputsets.write_canonical(self.store_sets, sid, data)
                    self.sets.forget(sid)
            if not self.entry_holds(entry, action):
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
            self._add_to_manifest(action.mkey, entry)
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

    def materialize(self, hit: Hit, action: Action) -> bool:
        """Put the stored object at the output, rechecked, and the dependency file beside it."""
        args = action.args
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            # A copy, not a hard link: a later compile writing to the output in place must never
            # reach the stored object through a shared inode.
            self.store.materialize(hit.record, out, allow_link=False)
        except (CorruptObject, ObjectMissing) as e:
            print(f"pp4.reuse: warning: {e}; compiling {args.output} instead", file=sys.stderr)
            return False
        bodies = []
        for sid in hit.entry["input_sets"]:  # one folder each: no file is in two
            bodies.append(self.sets.depfile_body(self.store_sets, sid, action.root))
            if sid not in self._in_state:  # the build's own copy, for its events and certificate
                self.sets.copy(self.store_sets, sid, self.state_sets)
                self._in_state.add(sid)
        depfile.write(args.depfile, args.output, bodies=bodies)
        return True

    # -- store ------------------------------------------------------------------------------

    def observations(self, action: Action, ran: Ran) -> tuple[list[list[str]], str | None]:
        """What a local compile observed, and why it must not be stored, if it must not."""
        pairs, problem = observed.from_run(ran, action.outputs(), self.states)
        return pairs, problem or time_problem(ran.time_macros, action.env)

    def write_depfile(self, action: Action, pairs: list[list[str]], ran: Ran | None = None) -> None:
        """The dependency file ninja reads: every regular file the compile read, this machine's paths
        (not observed: the compiler's own, mapped out of the root)."""
        args = action.args
        to_real = action.root.real if action.root is not None else (lambda p: p)
        if pairs or ran is None:
            files = {r for p, s in pairs if len(s) == 64 and (r := to_real(p)) is not None}
        else:
            written = depfile.parse_depfile(Path(args.depfile).read_text()) if Path(args.depfile).exists() else []
            files = {r for d in written if (r := ran.real(d)) is not None}
        depfile.write(args.depfile, args.output, sorted(files))

    def store_compile(self, action: Action, pairs: list[list[str]], problem: str | None, seconds: float) -> dict:
        """Store a fresh object under what its compile observed. Returns the event fields: the
        action key (None when not stored, with the reason), the observation set, the object's sha256."""
        args = action.args
        sha, _ = sha256_and_size(args.output)
        result = {"action_key": None, "input_sets": [], "object_sha256": sha, "not_stored": None, "env": action.env,
                  "command": list(action.command), "mounts": action.root.mounts if action.root else None}
        if problem is not None:
            return dict(result, not_stored=problem)
        encoded = dict(inputsets.encode(part) for part in observed.by_folder(pairs))
        sids = sorted(encoded)
        for sid, data in encoded.items():
            inputsets.write_canonical(self.state_sets, sid, data)
        result["input_sets"] = sids
        if self.store is None:
            return dict(result, not_stored=self.store_problem or "reuse is off")
        akey = action_key(action.mkey, sids)
        payload = {"manifest_key": action.mkey, "command": list(action.command), "input_sets": sids,
                   "env": action.env, "in_root": action.root is not None,
                   "compiled_for": {"output": os.path.abspath(args.output), "cwd": os.getcwd()},
                   "duration_s": round(seconds, 3)}
        entry = {"action_key": akey, "input_sets": sids}
        existing = self.store.lookup(akey)
        if existing is not None:
            # The same action, stored by an earlier compile (whose entry the manifest may lack:
            # a put killed before the manifest was written).
            self._add_to_manifest(action.mkey, entry)
            self._publish(action.mkey, entry, encoded, existing, args.output)
            if existing.object_sha256 != sha:
                return dict(result, not_stored=f"the store holds another object for this action "
                                               f"({existing.object_sha256[:16]}): the compiler is not deterministic here")
            return dict(result, action_key=akey, not_stored=None)
        try:
            # the sets first: an entry or record must never name a set the store lacks
            for sid, data in encoded.items():
                inputsets.write_canonical(self.store_sets, sid, data)
        except OSError as e:  # a full or read-only store: said as the store says it for objects
            problem = self.store.os_error(e, "writing an observation set")
            print(f"pp4.reuse: warning: {problem} (the object was built; it is just not stored)", file=sys.stderr)
            return dict(result, not_stored=str(problem))
        try:
            record = self.store.put(akey, args.output, payload)
        except StoreError as e:
            print(f"pp4.reuse: warning: {e} (the object was built; it is just not stored)", file=sys.stderr)
            return dict(result, not_stored=str(e))
        if record.object_sha256 != sha:
            return dict(result, not_stored="the object changed while it was being stored")
        self._add_to_manifest(action.mkey, entry)
        return dict(result, action_key=akey, remote=self._publish(action.mkey, entry, encoded, record, args.output))

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
    def compile_lock(self, action: Action):
        """Held while compiling, per manifest key: the same command run by two builds at once (two
        build folders or checkouts, whose commands are the same in the fixed root) compiles once,
        and the second then restores what the first stored. Waiting is a scheduling choice, never
        a correctness one: the lookup after it decides. Yields True when it waited."""
        if self.store is None:
            yield False
            return
        with self.manifests.lock(action.mkey, lambda: True) as waited:
            yield waited

    # -- events -----------------------------------------------------------------------------

    def event_doc(self, action: Action, **fields) -> dict:
        args = action.args
        return {"output": args.output, "source": os.path.abspath(args.source), "root": self.cfg.root_for(args.source),
                **fields}

    def event(self, action: Action, **fields) -> None:
        events.write(self.cfg.state_dir, action.args.output, self.event_doc(action, **fields))

    def hit_doc(self, action: Action, hit: Hit, seconds: float, via: str) -> dict:
        payload = hit.record.payload
        if hit.tier == "remote":
            via += ", from the remote store"
        return self.event_doc(action, status="reused", via=via, tier=hit.tier,
                              fetched_from=payload.get("fetched_from") if hit.tier == "remote" else None,
                              action_key=hit.entry["action_key"], object_sha256=hit.record.object_sha256,
                              input_sets=hit.entry["input_sets"], command=list(action.command),
                              mounts=action.root.mounts if action.root else None,
                              reused_from=payload.get("compiled_for"), compile_duration_s=payload.get("duration_s"),
                              restore_duration_s=round(seconds, 4), env=action.env)


def time_problem(time_macros, env: dict[str, str]) -> str | None:
    """Why a compile that expanded a time macro cannot be stored: __TIMESTAMP__ is its source's
    modification time; __DATE__ and __TIME__ are the clock's unless SOURCE_DATE_EPOCH fixes them."""
    loose = [m for m in time_macros if m == "__TIMESTAMP__" or "SOURCE_DATE_EPOCH" not in env]
    if loose:
        return (f"its preprocessing expands {', '.join(loose)} (gcc -Wdate-time says so), which no key "
                "covers: this unit is compiled every time")
    return None


# ---------------------------------------------------------------------------------------------
# one compile


def notify_once(cfg: ReuseConfig, lines: list[str]) -> None:
    """Print notices once per ninja run: the first of its processes to claim the run prints them.
    The toolchain variables set here that do not reach the compilers (pp4.compilerenv), and what
    this machine cannot do (the fixed root, the observer)."""
    if not lines:
        return
    run_id = _ninja_run()
    if run_id is not None:
        marks = Path(cfg.state_dir) / "notices"
        tag = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
        try:
            marks.mkdir(parents=True, exist_ok=True)
            for old in marks.iterdir():  # runs that are over
                if not Path("/proc", old.name.split("-")[0]).exists():
                    old.unlink(missing_ok=True)
            os.close(os.open(marks / f"{run_id}-{tag}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        except OSError:
            pass
    for line in lines:
        print(f"pp4: notice: {line}", file=sys.stderr)


def env_notices(cfg: ReuseConfig) -> list[str]:
    return compilerenv.notices(dict(os.environ), cfg.folded, "build")


def machine_notices(root_problem: str | None, ran: Ran) -> list[str]:
    lines = []
    if root_problem or ran.root_problem:
        lines.append(f"compiles run where they are, not in the fixed root (/pp4): {root_problem or ran.root_problem}. Objects then "
                     "name this checkout's folders, so other folders and machines do not share them (docs/reuse.md)")
    if ran.trace_problem:
        lines.append(f"compiles are not observed ({ran.trace_problem}): they still run, but nothing new is stored "
                     "(docs/reuse.md)")
    return lines


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
    notify_once(cfg, env_notices(cfg))
    reuser = Reuser(cfg)
    t0 = time.monotonic()
    action = reuser.action(args, env)
    hit = reuser.lookup(action)
    if hit is not None and reuser.materialize(hit, action):
        events.write(cfg.state_dir, args.output, reuser.hit_doc(action, hit, time.monotonic() - t0, via="wrapper"))
        reuser.hasher.save()
        return 0
    try:
        with reuser.compile_lock(action) as waited:
            if waited:  # the same command was compiling elsewhere (another build folder, another variant)
                hit = reuser.lookup(action)
                if hit is not None and reuser.materialize(hit, action):
                    events.write(cfg.state_dir, args.output,
                                 reuser.hit_doc(action, hit, time.monotonic() - t0, via="wrapper, after the same compile"))
                    return 0
            return _compile(cfg, reuser, action)
    finally:
        reuser.hasher.save()


def _compile(cfg: ReuseConfig, reuser: Reuser, action: Action) -> int:
    args = action.args
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() or out.is_symlink():
        out.unlink()  # never write through a link that may share its inode with a stored object
    if cfg.executor:  # imported only then: every compile's wrapper starts without it
        from pp4.reuse.cluster.executor import ClusterExecutor

        cluster = ClusterExecutor.from_config(cfg.executor, cfg.state_dir)
        done = cluster.run(action, cfg.root_for(args.source), cfg.limits, reuser.states) if cluster else None
        if done is not None:
            reuser.write_depfile(action, done.observations)
            stored = reuser.store_compile(action, done.observations, time_problem(done.time_macros, action.env),
                                          done.duration_s)
            reuser.event(action, status="compiled", compile_duration_s=done.duration_s, executed_on=done.node, **stored)
            return 0
    ran = run(list(args.argv), action.env, cfg.limits, cfg.runs_dir(), action.root)
    sys.stderr.buffer.write(ran.root.shown(ran.stderr) if ran.root is not None else ran.stderr)
    sys.stderr.flush()
    notify_once(cfg, machine_notices(reuser.root_problem, ran))
    if ran.returncode != 0:
        return ran.returncode
    pairs, problem = reuser.observations(action, ran)
    reuser.write_depfile(action, pairs, ran)
    stored = reuser.store_compile(action, pairs, problem, ran.seconds)
    reuser.event(action, status="compiled", compile_duration_s=round(ran.seconds, 3), missed=reuser.missed, **stored)
    return 0


# ---------------------------------------------------------------------------------------------
# the prepass


def prepass(cfg: ReuseConfig, actions_file: Path, stamp: Path) -> int:
    t0, cpu0 = time.monotonic(), time.process_time()
    actions = json.loads(actions_file.read_text())["actions"]
    notify_once(cfg, env_notices(cfg))
    reuser = Reuser(cfg)
    restored = checked = 0
    hits: dict[str, dict] = {}
    for doc in actions:
        args = actionkey.parse_compile(doc["argv"])
        marker = Path(args.output + MARKER_SUFFIX)
        if marker.exists():  # restored by an earlier prepass that never got claimed: start over
            for p in (marker, Path(args.output), Path(args.depfile)):
                p.unlink(missing_ok=True)
        if Path(args.output).exists():
            continue  # ninja decides about existing objects; their edges run the full wrapper
        checked += 1
        t = time.monotonic()
        action = reuser.action(args, doc["env"])
        hit = reuser.lookup(action)
        if hit is not None and reuser.materialize(hit, action):
            marker.write_text(hit.entry["action_key"] + "\n")
            hits[args.output] = reuser.hit_doc(action, hit, time.monotonic() - t, via="prepass")
            restored += 1
    reuser.hasher.save()
    # One batch file for all of them, after the markers: killed before it is in place, the markers
    # make the next prepass restore those objects again (pp4/reuse/events.py).
    batch = events.write_batch(cfg.state_dir, hits)
    # The stamp's dependencies: every file every compile seen so far read, so that an edit of any
    # of them runs the prepass again before the compiles that ninja will then find out of date.
    deps: set[str] = set()
    known = events.Events(cfg.state_dir, batch)
    for doc in actions:
        ev = known.get(doc["output"])
        if not isinstance(ev, dict):
            continue
        mapping = Root.from_mounts(ev["mounts"]) if ev.get("mounts") else None
        for sid in ev.get("input_sets", []):
            deps.update(reuser.sets.files(reuser.state_sets, sid, mapping))
    stamp.parent.mkdir(parents=True, exist_ok=True)
    depfile.write(str(stamp) + ".d", str(stamp), sorted(deps))
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
