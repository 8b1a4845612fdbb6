"""The reuse rule: skip a compile only when everything it observed last time holds now.

Run by ninja through `python -m pp4.reuse` (pp4/reuse/__main__.py): one compile edge
(pp4/reuse/edge.py) or the prepass (pp4/reuse/prepass.py); both use the Reuser here.

A compile runs in the fixed execution root, observed (pp4/execution/). Its *manifest key* is the
hash of the command as it runs there (fixed paths, `-D` values as written) and its environment;
its *observation set* is every path its processes asked about with the state found there
(pp4/reuse/observations.py); the *action key* (manifest key + the set's name) names the stored object.
A lookup takes the manifest's entries newest first and restores the first whose every observation
holds now, then writes the dependency file from the set's files. A compile edge that misses may
still restore another variant's object of the unit, where the compilers prove the module's name
cannot reach it (pp4/reuse/variants.py). Otherwise the unit compiles and is stored, unless it
cannot be trusted: not observed, an input changed while it ran, it wrote outside its outputs, or
gcc says its preprocessing expanded a time macro that SOURCE_DATE_EPOCH does not fix
(pp4/execution/run.py).

The prepass, which every compile edge waits for, does the lookups of all compiles whose object is
missing in one process (each path's state worked out once) and restores the hits; each of those
edges then only claims its object (a marker the prepass left), which costs a shell `test`, not a
Python start-up. Every compile and every reuse writes an event (build/.pp4/events/) that the
certificate collects.
"""

from __future__ import annotations

import hashlib
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from pp4 import paths, statedir
from pp4.build.config import ReuseConfig
from pp4.execution import depfile
from pp4.execution.root import Root
from pp4.files import canonical_json, sha256_and_size
from pp4.build import events
from pp4.reuse import inputsets, observations, pathstates, timemacros, variants
from pp4.reuse.notices import notify_once
from pp4.reuse.actionkey import CompileArgs, FileHasher
from pp4.store.front import Found, StoreFront
from pp4.store.manifests import ManifestEntry
from pp4.store.records import ActionRecord, StoreError
from pp4.toolchain.limits import Limits

if TYPE_CHECKING:
    from pp4.execution.run import Ran
    from pp4.store import signing

MARKER_SUFFIX = ".pp4-reused"
WARNINGS_KEPT = 1 << 20  # of a compile's messages, kept with its entry and replayed on every restore
# 5: observed in a closed world (every system call classed), drivers asked about the CPU; 6: in the root,
# __FILE__ and debug information name the source root relative to itself (pp4/execution/run.py)
KEY_FORMAT = 6


@attrs.frozen
class Action:
    """One compile as the reuse rule sees it."""
    args: CompileArgs
    env: dict
    root: Root | None  # the fixed root it runs in; None where namespaces cannot be made here
    command: tuple[str, ...]  # as it runs: the root's paths, `-D` values as written
    mkey: str
    # Why it runs outside the root though the root works here (what the root hid from it, or an
    # object that names the folder it is compiled in): stored so, its entry is what the same
    # command's lookup in the root may restore (Reuser.find).
    outside_root: str | None = None

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


def sound_entry(mkey: str, entry: ManifestEntry) -> bool:
    """Whether a manifest entry's action key follows from it: a flipped byte in a manifest must
    never lead the lookup to another action's object."""
    sets = list(entry.input_sets)
    return len(sets) > 0 and sets == sorted(set(sets)) and action_key(mkey, sets) == entry.action_key


class Reuser:
    """Lookups and stores through the store's front; each path's state worked out once per process."""

    def __init__(self, cfg: ReuseConfig):
        self.cfg = cfg  # the build's reuse settings (pp4/build/config.py)
        self.limits = Limits.from_dict(cfg.limits)
        self.hasher = FileHasher(paths.file_hashes())
        self.states = pathstates.States(self.hasher)
        self.sets = inputsets.SetChecker(self.states)
        self.state_sets = inputsets.directory(cfg.state_dir)
        self._in_state: set[str] = set()  # packs this process made sure the build's state dir holds
        self.store_problem: str | None = None  # why a configured store cannot be used
        self.key_problem: str | None = None  # why this builder cannot sign (then nothing is stored)
        self.front: StoreFront | None = None
        if cfg.store:
            signer, trust = self._keys()
            try:
                self.front = StoreFront(cfg.store, cfg.remote, cfg.state_dir, trust, signer,
                                        pack_problem=self.sets.problem)
            except StoreError as e:  # e.g. a read-only or unwritable place with no store yet
                self.store_problem = str(e)
                print(f"pp4.reuse: warning: {e} (building without reuse: every object is compiled, none stored)",
                      file=sys.stderr)
        self.store_sets = self.front.sets if self.front is not None else None
        self._root_ok: bool | None = None
        self.root_problem: str | None = None  # why compiles cannot run in the fixed root here
        self.missed: str | None = None  # why the last lookup's newest entry did not hold
        self.shared_refused: str | None = None  # why another variant's object was not proven this one's

    def _keys(self) -> "tuple[signing.Signer | None, signing.Trust | None]":
        """This builder's signing key and the build's trust list; a key that cannot be used is said
        once a ninja run (nothing is stored), a trust list that cannot be read too (nothing is
        restored)."""
        from pp4.store import signing

        signer = trust = None
        own = None
        try:
            signer = signing.load_signer(self.cfg.trust.get("signing_key"))
            own = signer.public
        except signing.SigningKeyError as e:
            self.key_problem = str(e)
            notify_once(self.cfg.state_dir, [f"{e}: compiles run, and nothing is stored"], tag="signing-key")
            try:
                own = signing.read_own_public(self.cfg.trust.get("signing_key"))
            except signing.SigningKeyError:
                own = None
        try:
            trust = signing.load_trust(self.cfg.trust.get("keys"), self.cfg.trust.get("require_signers", 1), own)
        except signing.SigningKeyError as e:
            notify_once(self.cfg.state_dir, [f"the trust list cannot be read ({e}): nothing is restored"],
                        tag="trust-list")
        return signer, trust

    def note_refusals(self) -> None:
        """Say once a ninja run that stored entries were not restored for who stored them: how many
        this process met, and the first one's reason (each is also logged in build/.pp4/untrusted.log)."""
        if self.front is None or not self.front.refused:
            return
        log = statedir.part(self.cfg.state_dir, statedir.UNTRUSTED)
        try:
            with open(log, "a") as f:
                for key, why in self.front.refused:
                    f.write(f"{key} {why}\n")
        except OSError:
            pass
        (key, why), n = self.front.refused[0], len(self.front.refused)
        notify_once(self.cfg.state_dir, [
            f"{n} stored entr{'y was' if n == 1 else 'ies were'} not restored for who stored them (first, action "
            f"{key[:16]}: {why}); those units compile here. The list: {log}; whose entries a build restores: "
            "docs/store.md, signed entries"], tag="untrusted")
        self.front.refused.clear()

    # -- the action -------------------------------------------------------------------------

    def root_works(self) -> bool:
        if self._root_ok is None:
            from pp4.execution.root import unavailable

            self.root_problem = unavailable(str(self.cfg.runs_dir()))
            self._root_ok = self.root_problem is None
        return self._root_ok

    def action(self, args: CompileArgs, env: dict[str, str], outside_root: str | None = None) -> Action:
        """The compile as it runs: in the fixed root where namespaces can be made here, unless
        outside_root says why it must run where it is (the root hides something from it, or its
        object names the folder it is compiled in: pp4/reuse/edge.py)."""
        root = None
        if outside_root is None and self.root_works():
            root = Root.make(os.getcwd(), self.cfg.places, self.cfg.root_for(args.source), self.cfg.builddir())
        command = tuple(root.command(list(args.argv)) if root is not None else args.argv)
        return Action(args, env, root, command, manifest_key(command, env, root is not None), outside_root)

    def prefetch(self, actions: list[Action]) -> int:
        """What the remote tier holds for these compiles, brought into the local store in a few
        round trips (pp4/store/front.py), so that find() restores them from there."""
        if self.front is None or self.front.remote is None or not actions:
            return 0
        return self.front.prefetch([(a.mkey, self.group(a), (lambda e, a=a: sound_entry(a.mkey, e)),
                                     (lambda e, a=a: self.observations_hold(e, a))) for a in actions])

    def find(self, action: Action, remote: bool = True) -> tuple[Found, Action] | None:
        """A stored object for this compile as it runs in the root, else as it runs where it is
        (what a compile the root hid something from was stored as): the hit and the action it is
        for. remote False: the local store alone."""
        hit = self.lookup(action, remote=remote)
        if hit is not None or action.root is None or self.front is None:
            return (hit, action) if hit is not None else None
        outside = self.action(action.args, action.env, outside_root="stored so")
        missed = self.missed
        hit = self.front.find(outside.mkey, lambda e: sound_entry(outside.mkey, e),
                              lambda e: self.observations_hold(e, outside),
                              fits=lambda e, record: bool(record.payload.get("outside_root")), remote=False)
        self.missed = missed
        return (hit, outside) if hit is not None else None

    def name_free_key(self, action: Action) -> str | None:
        """The key the compile shares with other variants' compiles of the unit (pp4/reuse/variants.py)."""
        return variants.name_free_key(action.command, action.env, action.root is not None, self.cfg.name_macros)

    def group(self, action: Action) -> str:
        """The remote group of a compile's entries (pp4/store/remote/tier.py): the key its variants
        share, else its own manifest key, so one read brings both."""
        return self.name_free_key(action) or action.mkey

    # -- lookup -----------------------------------------------------------------------------

    def lookup(self, action: Action, remote: bool = True) -> Found | None:
        """A stored object for this compile, from whichever tier holds one (pp4/store/front.py;
        remote False: the local store alone)."""
        if self.front is None:
            return None
        self.missed = None

        def sound(entry: ManifestEntry) -> bool:
            if sound_entry(action.mkey, entry):
                return True
            self.missed = self.missed or "its newest stored entry is damaged"
            return False

        def holds(entry: ManifestEntry) -> bool:
            if self.observations_hold(entry, action):
                return True
            self.note_miss(entry, action)
            return False

        # The group names a remote value only: worked out where a remote tier will be asked.
        group = self.group(action) if remote and self.front.remote is not None else None
        return self.front.find(action.mkey, sound, holds, remote=remote, group=group)

    def observations_hold(self, entry: ManifestEntry, action: Action) -> bool:
        """Whether every observation of the entry's input sets holds now, at this compile's paths."""
        return self.sets.all_match(self.store_sets, entry.pack, entry.input_sets, action.root)

    def lookup_variant(self, action: Action) -> Found | None:
        """Another variant's object for this unit, where this compile is proven to give the same
        (pp4/reuse/variants.py): a stored compile whose command is this one but for the name
        macros, whose observations hold now. The proof runs once, and only for such an entry."""
        nkey = self.name_free_key(action) if self.front is not None else None
        if nkey is None:
            return None
        proof: dict[str, str | None] = {}

        def holds(entry: ManifestEntry) -> bool:
            if action_key(action.mkey, list(entry.input_sets)) == entry.action_key:
                return False  # this very command's entry: the direct lookup's, which it did not satisfy
            if self.observations_hold(entry, action):
                return True
            if self.shared_refused is None:
                differs = self.first_difference(entry, action)
                self.shared_refused = f"another variant's compile read what differs here: {differs}" if differs else None
            return False

        def fits(entry: ManifestEntry, record: ActionRecord) -> bool:
            p = record.payload
            other, command = p.get("manifest_key"), p.get("command")
            if not isinstance(command, list) or not isinstance(p.get("env"), dict) or other == action.mkey:
                return False
            in_root = bool(p.get("in_root"))
            if (manifest_key(command, p["env"], in_root) != other or not sound_entry(other, entry)
                    or variants.name_free_key(command, p["env"], in_root, self.cfg.name_macros) != nkey):
                return False
            if "why" not in proof:
                proof["why"] = variants.unproven(list(action.args.argv), action.args.language, action.env,
                                                 self.cfg.name_macros, self.limits, self.cfg.runs_dir(),
                                                 action.root)
                self.shared_refused = proof["why"]
            return proof["why"] is None

        return self.front.find(nkey, lambda entry: True, holds, fits=fits, group=nkey)

    def adopt(self, action: Action, hit: Found) -> ActionRecord | None:
        """Keep another variant's object as this command's own (its own manifest entry and action
        record, signed by this builder, which proved it), so that later lookups and the prepass find
        it without a proof. Its record."""
        sids = list(hit.entry.input_sets)
        akey = action_key(action.mkey, sids)
        pack = self.front.pack(hit.entry.pack)
        if pack is None:
            return None
        payload = {**hit.record.payload, "manifest_key": action.mkey, "command": list(action.command),
                   "env": action.env, "in_root": action.root is not None,
                   "shared_from": {"manifest_key": hit.record.payload.get("manifest_key"),
                                   "compiled_for": hit.record.payload.get("compiled_for")}}
        kept = self.front.keep(action.mkey, ManifestEntry(akey, sids, pack.name), pack, action.args.output,
                               hit.record.object_sha256, payload, sound=lambda e: sound_entry(action.mkey, e),
                               group=self.group(action))
        return kept.record if kept.record is not None and kept.record.object_sha256 == hit.record.object_sha256 else None

    def note_miss(self, entry: ManifestEntry, action: Action) -> None:
        """Why the newest stored entry of this command did not hold, for the compile's event: the
        first question of someone whose build compiled what they expected restored."""
        if self.missed is None:
            self.missed = self.first_difference(entry, action)

    def first_difference(self, entry: ManifestEntry, action: Action) -> str | None:
        """The first observation of an entry that does not hold here, and how many more."""
        to_real = action.root.real if action.root is not None else (lambda p: p)
        for sid in entry.input_sets:
            pairs = self.sets.load(self.store_sets, entry.pack, sid)
            if pairs is None:
                return f"its newest stored entry names an observation set the store lacks ({sid[:16]})"
            changed = pathstates.differences(pairs, to_real, self.states)
            if changed:
                return f"{changed[0]} (and {len(changed) - 1} more)" if len(changed) > 1 else changed[0]
        return None

    def materialize(self, hit: Found, action: Action) -> bool:
        """Put the stored object at the output, rechecked, and the dependency file beside it."""
        args = action.args
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        problem = self.front.materialize(hit, out)
        if problem is not None:
            print(f"pp4.reuse: warning: {problem}; compiling {args.output} instead", file=sys.stderr)
            return False
        entry = hit.entry
        # one folder each: no file is in two
        bodies = [self.sets.depfile_body(self.store_sets, entry.pack, sid, action.root) for sid in entry.input_sets]
        if entry.pack not in self._in_state:  # the build's own copy, for its events and certificate
            self.sets.keep(self.store_sets, entry.pack, self.state_sets)
            self._in_state.add(entry.pack)
        depfile.write(args.depfile, args.output, bodies=bodies)
        warnings = hit.record.payload.get("warnings")
        if isinstance(warnings, str) and warnings:
            # What the compiler said when it made this object, as it said it (ccache replays it too),
            # its fixed paths shown as this machine's folders.
            text = warnings.encode("utf-8", "replace")
            sys.stderr.buffer.write(action.root.shown(text) if action.root is not None else text)
            sys.stderr.flush()
        return True

    # -- store ------------------------------------------------------------------------------

    def observations(self, action: Action, ran: "Ran") -> tuple[list[list[str]], str | None]:
        """What a local compile observed, and why it must not be stored, if it must not."""
        pairs, problem = observations.from_run(ran, action.outputs(), self.states)
        problem = (problem or timemacros.problem(observations.time_macros(ran, pairs, self.hasher), action.env)
                   or observations.device_line_times(ran))
        if problem is None:
            pairs = sorted(pairs + observations.pins(ran, action.args.output))
        return pairs, problem

    def write_depfile(self, action: Action, pairs: list[list[str]], ran: "Ran | None" = None) -> None:
        """The dependency file ninja reads: every regular file the compile read, this machine's paths
        (not observed: the compiler's own, mapped out of the root)."""
        args = action.args
        to_real = action.root.real if action.root is not None else (lambda p: p)
        if pairs or ran is None:
            files = {r for p, s in pairs if pathstates.is_file(s) and (r := to_real(p)) is not None}
        else:
            written = depfile.parse_depfile(Path(args.depfile).read_text()) if Path(args.depfile).exists() else []
            files = {r for d in written if (r := ran.real(d)) is not None}
        depfile.write(args.depfile, args.output, sorted(files))

    def store_compile(self, action: Action, pairs: list[list[str]], problem: str | None, seconds: float,
                      warnings: bytes = b"") -> dict:
        """Store a fresh object under what its compile observed. Returns the event fields: the
        action key (None when not stored, with the reason), the observation set, the object's sha256."""
        args = action.args
        sha, _ = sha256_and_size(args.output)
        result = {"action_key": None, "input_sets": [], "sets_pack": None, "object_sha256": sha, "not_stored": None,
                  "env": action.env, "command": list(action.command),
                  "mounts": action.root.mounts if action.root else None}
        if problem is not None:
            return dict(result, not_stored=problem)
        encoded = inputsets.encode_by_folder(pairs)
        sids = sorted(encoded)
        pack = inputsets.pack(encoded)
        inputsets.write_pack(self.state_sets, pack)
        result.update(input_sets=sids, sets_pack=pack.name)
        if self.front is None:
            return dict(result, not_stored=self.store_problem or "reuse is off")
        akey = action_key(action.mkey, sids)
        payload = {"manifest_key": action.mkey, "command": list(action.command),
                   "env": action.env, "in_root": action.root is not None,
                   "compiled_for": {"output": os.path.abspath(args.output), "cwd": os.getcwd()},
                   "duration_s": round(seconds, 3)}
        if action.outside_root:
            payload["outside_root"] = action.outside_root
        if warnings:  # what the compiler said, replayed by every restore (and signed with the rest)
            kept_bytes = warnings[:WARNINGS_KEPT]
            payload["warnings"] = kept_bytes.decode("utf-8", "replace") + (
                f"[pp4: {len(warnings) - WARNINGS_KEPT} more bytes of the compiler's messages were not kept]\n"
                if len(warnings) > WARNINGS_KEPT else "")
        nkey = self.name_free_key(action)
        entry = ManifestEntry(akey, sids, pack.name)
        kept = self.front.keep(action.mkey, entry, pack, args.output, sha, payload,
                               sound=lambda e: sound_entry(action.mkey, e), group=nkey or action.mkey)
        if kept.record is None:
            return dict(result, not_stored=kept.problem)
        result.update(signatures=list(kept.record.signatures), signed_payload=signed_part(kept.record.payload))
        if nkey is not None:  # where other variants of this unit look (pp4/reuse/variants.py)
            self.front.index(nkey, entry)
        return dict(result, action_key=akey, remote=kept.remote)

    @contextmanager
    def compile_lock(self, action: Action):
        """The store's lock of this command while it compiles (pp4/store/front.py). Not of its
        name-free form: two variants' compiles of a unit run side by side rather than one waiting
        for the other, whose object a proof may then refuse."""
        if self.front is None:
            yield False
            return
        with self.front.compile_lock(action.mkey) as waited:
            yield waited

    # -- events -----------------------------------------------------------------------------

    def make_event(self, action: Action, **fields) -> events.CompileEvent:
        args = action.args
        return events.CompileEvent(output=args.output, source=os.path.abspath(args.source),
                                   root=self.cfg.root_for(args.source), **fields)

    def event(self, action: Action, **fields) -> None:
        events.write(self.cfg.state_dir, self.make_event(action, **fields))

    def hit_event(self, action: Action, hit: Found, seconds: float, via: str) -> events.CompileEvent:
        payload = hit.record.payload
        if hit.tier == "remote":
            via += ", from the remote store"
        return self.make_event(action, status="reused", via=via, tier=hit.tier,
                               signatures=[sig for sig in hit.record.signatures if sig.get("signer") in hit.signers],
                               signed_payload=signed_part(payload),
                               fetched_from=payload.get("fetched_from") if hit.tier == "remote" else None,
                               action_key=hit.entry.action_key, object_sha256=hit.record.object_sha256,
                               input_sets=hit.entry.input_sets, sets_pack=hit.entry.pack, command=action.command,
                               mounts=action.root.mounts if action.root else None,
                               reused_from=payload.get("compiled_for"), compile_duration_s=payload.get("duration_s"),
                               restore_duration_s=round(seconds, 4), env=action.env)


def signed_part(payload: dict) -> dict:
    """What of an action record's payload its signatures cover (pp4/store/signing.py), for the
    event and the certificate, which check them again."""
    from pp4.store.signing import SIGNED_PAYLOAD

    return {k: payload.get(k) for k in SIGNED_PAYLOAD}
