"""The certificate of a build, and its build record: one file that says exactly what was shipped.

    python -m pp4.certify.certificate write CONFIG ACTIONS OUT.json.gz     (run by ninja after the pins)

The certificate is a gzip-compressed JSON manifest of every object: its command as configure wrote
it and as it ran in the fixed root, its environment, the root's mounts (which folder of this
machine each fixed path was), its action key, whether it was compiled or reused (and from which
action, compiled for which output), its sha256 and the compile duration. What each compile
observed is listed once per distinct set, in "input_sets" (name -> [path, state] pairs; the name is
the sha256 of the set's canonical text, pp4/reuse/inputsets.py), and each object names its set.
Each module lists what its link observed (the objects, libraries as the linker resolved them and
where it looked for them and found nothing, linker scripts, the linker's programs) with their
states, and the root's mounts to read them with.
Its hash is the sha256 of the uncompressed JSON.

Format 5 (FORMAT). 4 -> 5: each module carries "link_sha256", the module's sha256 as its link made
it (its link record's), so that `ninja certify` judges the module by the certificate alone; each
object already carries its entry's signatures and the payload they cover, so nothing the audit
asks of the store is needed to pass it (an entry gc evicted since is a note); a module made with a
device link carries "device_link", what that link observed (as a module's link does).
Beside it, build-record.json names every built module's sha256, the compiler wheels' hashes, each
source tree's hash and the certificate's hash.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import time
from functools import partial
from pathlib import Path

import attrs

from pp4.sizes import counted
from pp4.build import config as buildconfig
from pp4 import interrupt
from pp4.certify import pin
from pp4.files import canonical_json, sha256_and_size, write_whole
from pp4.execution.root import Root
from pp4.build import events
from pp4.build import modules as buildmodules
from pp4.reuse import inputsets


FORMAT = 5  # see the module's docstring for what each format added


class CertificateError(Exception):
    pass


# What a certificate keeps of an object's event: how it was made and from what; not how the
# wrapper found it (by the prepass or not, why the newest entry missed, how long a restore took).
EVENT_FIELDS = ("status", "action_key", "not_stored", "reused_from", "root", "input_sets", "mounts", "command",
                "compile_duration_s", "tier", "fetched_from", "executed_on", "signatures", "signed_payload")


@attrs.frozen
class CertificateObject:
    """One object of a certificate: the compile configure planned (actions.json) and its event."""
    output: str
    target: str
    source: str
    argv: list = attrs.field(hash=False)
    env: dict = attrs.field(hash=False)
    object_sha256: str
    object_size: int
    event: events.CompileEvent

    def to_json(self) -> dict:
        made = self.event.to_json()
        return {"output": self.output, "target": self.target, "source": self.source, "argv": self.argv,
                "env": self.env, "object_sha256": self.object_sha256, "object_size": self.object_size,
                **{k: made[k] for k in EVENT_FIELDS}}


def record_path(certificate: Path) -> Path:
    return certificate.with_name("build-record.json")


def canonical(doc: dict) -> bytes:
    return canonical_json(doc)


def read(certificate: Path) -> tuple[dict, str]:
    """The certificate's document and its hash; CertificateError when it is damaged."""
    try:
        raw = gzip.decompress(certificate.read_bytes())
        return json.loads(raw), hashlib.sha256(raw).hexdigest()
    except FileNotFoundError:
        raise CertificateError(f"{certificate} does not exist: build first (`ninja`)") from None
    except (OSError, EOFError, ValueError, gzip.BadGzipFile) as e:
        raise CertificateError(f"{certificate} is damaged ({e}): rebuild it with `ninja` "
                               f"(delete it first, so that ninja writes it again)") from None


def document(config_path: Path, actions_path: Path, builddir: Path, targets: set[str] | None = None,
             read_set=None) -> dict:
    """The certificate's document for every object of ``targets`` (None: all): what each event
    recorded, checked against the object's bytes now. CertificateError lists what cannot be certified.
    read_set(pack, sid): a set from the build's state folder, where the caller has them read already."""
    state_dir = buildconfig.load(config_path).state_dir
    actions = [a for a in json.loads(actions_path.read_text())["actions"] if targets is None or a["target"] in targets]
    objects, problems, sets = [], [], {}
    sets_dir = inputsets.directory(state_dir)
    if read_set is None:
        read_set = partial(inputsets.SetChecker(None).load, sets_dir)
    known = events.Events(state_dir)
    for action in actions:
        ev = known.get(action["output"])
        if ev is None:
            problems.append(f"{action['output']}: no record of how it was built (neither "
                            f"{events.event_path(state_dir, action['output'])} nor an entry in "
                            f"{events.batch_path(state_dir)})")
            continue
        sha, size = sha256_and_size(action["output"])
        if sha != ev.object_sha256:
            problems.append(f"{action['output']}: sha256 {sha} differs from the one recorded when it was built")
        objects.append(CertificateObject(output=action["output"], target=action["target"], source=action["source"],
                                         argv=action["argv"], env=action.get("env", {}), object_sha256=sha,
                                         object_size=size, event=ev).to_json())
        for sid in ev.input_sets:
            if sid not in sets:
                sets[sid] = read_set(ev.sets_pack, sid)
                if sets[sid] is None:
                    problems.append(f"{action['output']}: its input set {sid} is missing or damaged in "
                                    f"{sets_dir}: rebuild it (delete the object first)")
    if problems:
        raise CertificateError("cannot certify this build:\n  " + "\n  ".join(problems))
    return {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "objects": objects, "input_sets": sets,
            "modules": _modules(actions, builddir, state_dir, json.loads(actions_path.read_text()).get("device_links"))}


def shipped(doc: dict) -> dict:
    """The certificate a wheel carries: what was built from what, never how each object was
    obtained (compiled or restored, from which tier, on which node, in how long) nor where the
    builder's folders were. Objects compiled in the fixed root are named as the root saw them, so
    two checkouts, or a cold build and one restored from the store, ship the same document. An
    object compiled without the root keeps its real paths: those are what it was built from."""
    objects, roots = [], {}
    for obj in doc["objects"]:
        mapping = Root.from_mounts(obj["mounts"]) if obj.get("mounts") else None
        if mapping is None:
            place = {"output": obj["output"], "source": obj["source"], "command": obj["argv"]}
        else:
            roots.setdefault(obj["target"], mapping)
            place = {"output": mapping.fixed(obj["output"]), "source": mapping.fixed(obj["source"]),
                     "command": obj["command"]}
        objects.append({"target": obj["target"], **place, "env": obj["env"], "in_root": mapping is not None,
                        "action_key": obj["action_key"], "input_sets": obj["input_sets"],
                        "object_sha256": obj["object_sha256"], "object_size": obj["object_size"]})
    modules = []
    for m in doc["modules"]:
        mapping = roots.get(m["target"])
        provenance = {k: mapping.fixed(v) if mapping is not None and isinstance(v, str) and v.startswith("/") else v
                      for k, v in m["provenance"].items()}
        links = m.get("link_inputs")
        if links is not None and mapping is not None:
            links = sorted([mapping.fixed(path), state] for path, state in links)
        modules.append({"target": m["target"], "module": m["module"], "file": Path(m["file"]).name,
                        "sha256": m["sha256"], "tree_sha256": m["tree_sha256"], "provenance": provenance,
                        "link_inputs": links})
    return {"format": doc["format"], "objects": objects, "input_sets": doc["input_sets"], "modules": modules}


def built_targets(builddir: Path, actions_path: Path) -> tuple[list[str], list[str]]:
    """(targets whose module, pin and every object are on disk; the other configured targets)."""
    actions = json.loads(actions_path.read_text())["actions"]
    built, missing = [], []
    for target in sorted({a["target"] for a in actions}):
        try:
            plan = buildmodules.load_plan(builddir, target)
        except buildconfig.BuildFolderError:
            missing.append(target)
            continue
        module = Path(plan.output)
        on_disk = [module, pin.pin_path_for(module), *(Path(a["output"]) for a in actions if a["target"] == target)]
        (built if all(p.exists() for p in on_disk) else missing).append(target)
    return built, missing


def write(config_path: Path, actions_path: Path, out: Path, say=print, read_set=None) -> str:
    """Write the certificate and its build record; say (print) gets the line that tells of it.
    read_set: as document's."""
    config = buildconfig.load(config_path)
    doc = document(config_path, actions_path, out.parent, read_set=read_set)
    raw = canonical(doc)
    digest = hashlib.sha256(raw).hexdigest()
    write_whole(out, gzip.compress(raw, compresslevel=6, mtime=0))  # 9 costs 5x the time for 2% fewer bytes
    record = build_record(config, doc["modules"], out, digest)
    write_whole(record_path(out), json.dumps(record, indent=1, sort_keys=True) + "\n")
    objects = doc["objects"]
    reused = sum(o["status"] == "reused" for o in objects)
    remote = sum(o.get("tier") == "remote" for o in objects)
    # Said here, once a build: a compile that was not stored is compiled again by the next build
    # folder, and the reason (a time macro, no observer, an input changed during the compile) is
    # what the user can act on.
    unstored = [o for o in objects if o["status"] == "compiled" and o.get("not_stored")]
    why = f", {len(unstored)} not stored: {unstored[0]['output']}: {unstored[0]['not_stored']}" if unstored else ""
    if len(unstored) > 1:
        why += " (each one's reason: build/certificate.json.gz, `not_stored`)"
    say(f"certificate {out}: sha256 {digest} ({counted(len(objects), 'object')}: {reused} reused"
          + (f" ({remote} from the remote store)" if remote else "") + f", {len(objects) - reused} compiled{why})")
    return digest


def _modules(actions: list[dict], builddir: Path, state_dir: str, device_links: list[dict] | None = None) -> list[dict]:
    out = []
    dlinks = {d["target"]: d["output"] for d in device_links or []}
    for target in sorted({a["target"] for a in actions}):
        plan = buildmodules.load_plan(builddir, target)
        module = Path(plan.output)
        p = pin.check(module, with_tree=True)  # the module must match its pin, sources included
        record = buildmodules.read_link(state_dir, str(module))
        out.append({"target": target, "module": plan.module, "file": str(module), "sha256": p["sha256"],
                    "source_key": p["source_key"], "root": plan.root, "provenance": plan.provenance,
                    "tree_sha256": p["tree_sha256"],
                    # What the link observed (the files it read and what it looked for and did not
                    # find), as it saw them, and where its root's paths are here; None when no link
                    # record is there (a module linked by an older pp4).
                    "link_inputs": sorted(record.observations) if record is not None else None,
                    "link_mounts": record.mounts if record is not None else None,
                    "link_not_observed": record.not_observed if record is not None else None,
                    # what the link made (pin.check above has held the module and its pin to it)
                    "link_sha256": record.sha256 if record is not None else None,
                    # {"action_key", "tier", "signers"} where the module was restored from the store
                    # instead of linked (pp4/reuse/link.py); {"action_key"} where this link was stored
                    "link_reuse": record.reuse if record is not None else None})
        if target in dlinks:  # the device link the module's link read (its bytes are in link_inputs)
            d = buildmodules.read_link(state_dir, dlinks[target])
            out[-1]["device_link"] = None if d is None else {
                "file": dlinks[target], "command": d.command, "inputs": sorted(d.observations), "mounts": d.mounts,
                "not_observed": d.not_observed, "reuse": d.reuse}
    return out


def build_record(config: buildconfig.BuildConfig, modules: list[dict], certificate: Path, digest: str) -> dict:
    """The build record for modules (the certificate's, or shipped()'s: then without the
    builder's folders, which shipped modules do not name)."""
    identity = config.reuse_config().toolchain  # content hashes of nvcc, cicc, ptxas, ...
    tc_prefix = None
    if modules:  # every module of a build uses the one toolchain configure chose
        tc_prefix = buildmodules.load_plan(certificate.parent, modules[0]["target"]).toolchain_prefix
    from pp4.toolchain.prefixcheck import read_manifest  # the standard library alone: nothing to load

    manifest = read_manifest(Path(tc_prefix)) if tc_prefix else None
    with_folders = all("root" in m for m in modules)
    return {
        "format": 1,
        "modules": [{k: m[k] for k in ("target", "module", "file", "sha256")} for m in modules],
        "compiler_wheels": manifest["wheels"] if manifest else None,
        "toolchain": {"prefix": tc_prefix, "files": identity} if with_folders else {"files": identity},
        "source_trees": [{"target": m["target"], **({"root": m["root"]} if with_folders else {}),
                          "sha256": m["tree_sha256"], "provenance": m["provenance"]} for m in modules],
        "certificate": {"file": str(certificate), "sha256": digest},
    }


@interrupt.command("pp4.certify.certificate")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 4 or argv[0] != "write":
        print("usage: python -m pp4.certify.certificate write CONFIG ACTIONS OUT.json.gz", file=sys.stderr)
        return 2
    try:
        events.mark_run(buildconfig.load(Path(argv[1])).state_dir)  # where this run starts in ninja's log
        write(Path(argv[1]), Path(argv[2]), Path(argv[3]))
    except (CertificateError, pin.PinError, buildconfig.BuildFolderError) as e:
        print(f"pp4.certify.certificate: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
