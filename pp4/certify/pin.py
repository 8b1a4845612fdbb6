"""Pins: what a built module is, and what it was built from, checked again before it is loaded.

A pin file (<module>.pin.json, written by the build after the link) holds the module's sha256 and a
source key: the hash of every source and header of the extension's tree, its flags and the
toolchain's identity. pp4.certify.loader refuses a module whose bytes or sources no longer match its pin.

A pin is written only for the module its link made: the module's sha256 must be the one its link
record keeps (build/.pp4/links/, pp4/build/modules.py), or the pin edge fails and names the file. A
module changed after its link (stripped, patched, written into) is never pinned again: the check
before ninja decides removes it, and ninja links or restores it. check() holds the pin to the
link record too, so a pin written by hand for a changed module is refused where it is loaded.

    python -m pp4.certify.pin write --plan build/p2p/plan.json --module build/p2p/pp4_p2p....so --out ....pin.json
    python -m pp4.certify.pin check build/p2p/pp4_p2p....so
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from pp4 import interrupt, statedir
from pp4.build.config import BuildFolderError
from pp4.build.modules import PlanRecord, load_plan_file, pin_path_for  # noqa: F401  (pin_path_for: pin's name too)
from pp4.files import sha256_file, write_if_changed
from pp4.paths import source_tree


class PinError(Exception):
    """A module does not match its pin, or has none."""


def tree_hashes(plan: PlanRecord, with_tree: bool = True) -> tuple[str, str | None]:
    """(source key, tree hash), reading each file of the tree once. The source key covers the
    files, the flags and the toolchain (what the pin checks); the tree hash covers the files alone,
    each named by its relative path and its sha256 (what a build record names as the source tree).
    Without with_tree the tree hash is None and its second sha256 pass over the files is skipped."""
    key, tree = hashlib.sha256(), hashlib.sha256()
    key.update(json.dumps([plan.cuda_flags, plan.cxx_flags, plan.link_flags, plan.toolchain]).encode())
    root = Path(plan.root)
    for f in source_tree(root, plan.sources):
        name = str(f.relative_to(root) if f.is_relative_to(root) else f).encode()
        data = f.read_bytes()
        key.update(b"\0" + name + b"\0")
        key.update(data)
        if with_tree:
            tree.update(name + b"\0")
            tree.update(hashlib.sha256(data).digest())
    return key.hexdigest(), tree.hexdigest() if with_tree else None


def source_key(plan: PlanRecord) -> str:
    return tree_hashes(plan, with_tree=False)[0]


def linked_sha256(plan_path: Path, plan: PlanRecord) -> str:
    """The sha256 the module's link record keeps; PinError where there is none (a module linked by
    another pp4, or whose record is gone)."""
    from pp4.build.modules import link_path, read_link

    state_dir = statedir.of_build(Path(plan_path).absolute().parent.parent)  # build/<target>/plan.json
    record = read_link(state_dir, plan.output_abs)
    if record is None or not record.sha256:
        raise PinError(f"{plan.output_abs} has no link record of this pp4 ({link_path(state_dir, plan.output_abs)}), "
                       "so nothing says what its link made: run ninja: it relinks or restores it")
    return record.sha256


def write(plan_path: Path, module: Path, out: Path) -> dict:
    plan = _plan(plan_path)
    sha = sha256_file(module)
    linked = linked_sha256(plan_path, plan)
    if sha != linked:
        raise PinError(f"{module} has sha256 {sha}, but its link made {linked}: it was changed after it was "
                       "linked and is not pinned again: run ninja: it relinks or restores it")
    pin = {
        "module": plan.module,
        "file": module.name,
        "sha256": sha,
        "source_key": source_key(plan),
        "plan": str(plan_path.absolute()),
        "toolchain": plan.toolchain,
    }
    write_if_changed(out, json.dumps(pin, indent=1, sort_keys=True) + "\n")
    return pin


def _plan(path: Path) -> PlanRecord:
    try:
        return load_plan_file(path)
    except BuildFolderError as e:
        raise PinError(str(e)) from None


def said(pin: dict) -> str:
    """The line that tells of a pin written."""
    return f"{pin['module']}: sha256 {pin['sha256']}, source key {pin['source_key']}"


def check(module: Path | str, module_sha256: str | None = None, with_tree: bool = False) -> dict:
    """The pin of a module after checking both its bytes and its sources; PinError otherwise.
    module: a path, or a str as the README writes it. module_sha256: the module's hash where the
    caller has just computed it. with_tree: add the tree hash of those sources (``tree_sha256``),
    from the same read of the files."""
    module = Path(module)
    pin_file = pin_path_for(module)
    try:
        pin = json.loads(pin_file.read_text())
    except FileNotFoundError:
        raise PinError(f"{module} has no pin file {pin_file}: build it with ninja, which writes the pin after linking") from None
    except ValueError as e:
        raise PinError(f"pin file {pin_file} is damaged ({e}): rebuild with ninja") from None
    actual = module_sha256 or sha256_file(module)
    if actual != pin["sha256"]:
        raise PinError(
            f"{module} has sha256 {actual}, but its pin says {pin['sha256']}: the module was changed after it "
            "was built. Rebuild it with ninja; do not load it."
        )
    plan = _plan(Path(pin["plan"]))
    linked = linked_sha256(Path(pin["plan"]), plan)
    if linked != pin["sha256"]:
        raise PinError(f"{module} and its pin {pin_file} say sha256 {pin['sha256']}, but its link made {linked}: "
                       "the module and its pin were changed after it was linked. Do not load it: run ninja: it "
                       "relinks or restores it")
    key, tree = tree_hashes(plan, with_tree)
    if key != pin["source_key"]:
        raise PinError(
            f"{module} was built from other sources, flags or toolchain than the ones now in {plan.root} "
            f"(source key {pin['source_key'][:16]}..., now {key[:16]}...). Rebuild with ninja."
        )
    return dict(pin, tree_sha256=tree) if with_tree else pin


@interrupt.command("pp4.certify.pin")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pp4.certify.pin", description="Write or check a built module's pin.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("--plan", type=Path, required=True)
    w.add_argument("--module", type=Path, required=True)
    w.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("check")
    c.add_argument("module", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "write":
            from pp4.build import config as buildconfig, events  # the command's alone

            builddir = buildconfig.builddir_of(".")  # ninja runs the pin edge where build.ninja is
            if builddir is not None:  # where this run starts in ninja's log, for the report
                events.mark_run(statedir.of_build(builddir))
            pin = write(args.plan, args.module, args.out)
        else:
            pin = check(args.module)
            print(f"{args.module}: matches its pin (sha256 {pin['sha256']})")
            return 0
    except PinError as e:
        print(f"pp4.certify.pin: error: {e}", file=sys.stderr)
        return 1
    print(said(pin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
