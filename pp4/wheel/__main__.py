"""`ninja wheel` (or `ninja wheel-TARGET`) runs this for each module:

    python -m pp4.wheel CONFIG ACTIONS TARGET DIST_DIR STAMP

It writes DIST_DIR/<distribution>-<version>-<tag>.whl, only when its bytes change, and STAMP
(build/TARGET/wheel.json: the wheel's name and sha256), which is what ninja tracks since the wheel's
name holds the module's version key. The wheel the stamp named before is removed when this one has
another name and its bytes are still the ones pp4 wrote, and a line says so; a wheel of the same
name with other bytes is written over, and a line says that too.

A --setup-py project's own wheel (`ninja wheel-PROJECT`, and `ninja wheel` for such a project) is
two steps (pp4/wheel/project.py): its setup.py's bdist_wheel without the modules, while they build,

    python -m pp4.wheel --project-stage CONFIG SETUP_PY STAGE_DIR TARGET...

then the wheel, with the modules:

    python -m pp4.wheel --project CONFIG ACTIONS SETUP_PY STAGE_DIR DIST_DIR STAMP TARGET...

`ninja wheel-built` runs

    python -m pp4.wheel --built CONFIG ACTIONS DIST_DIR

which packs the modules that are built (module, pin and every object on disk) as they are, builds
nothing, and names the configured modules that are not built.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from pp4 import interrupt
from pp4.certify.certificate import CertificateError, built_targets
from pp4.certify.pin import PinError
from pp4.files import sha256_file, write_if_changed
from pp4.plan.ninjafile import wheel_stamp_path
from pp4.sizes import human_bytes
from pp4.wheel.contents import WheelError, build



def replace_old(stamp: Path, new_wheel: Path, new_version: str) -> str | None:
    """Remove the wheel this target's stamp names when the new one has another name, so that
    `pip install dist/*.whl` finds one version of each distribution; only when its bytes are still
    the ones pp4 wrote (a file the user changed or put there is left). Returns the line that names
    what was removed: nothing a user may have used goes without a word."""
    try:
        old = json.loads(stamp.read_text())
        old_wheel = Path(old["wheel"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if old_wheel != new_wheel and old_wheel.is_file() and sha256_file(old_wheel) == old.get("sha256"):
        old_wheel.unlink()
        return (f"removed {old_wheel}, this target's wheel of version {old.get('version')}, which version "
                f"{new_version} replaces (copy it elsewhere before `ninja wheel` to keep both)")
    return None


def replacing_same_name(path: Path, data: bytes) -> str | None:
    """A wheel of this name with other bytes (for a module's wheel: the same module, torch pin and
    loader, as its version says, and another certificate inside). Said, since it is written over."""
    try:
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return None
        before = sha256_file(path)
    except OSError:
        return None
    return (f"replaced {path} (sha256 {before}), a wheel of the same name and version with other bytes "
            "(for a module's wheel: the same module, another record of what it was built from)")


def pack(config: Path, actions: Path, target: str, dist_dir: Path, stamp: Path, setup_py: Path | None = None,
         targets: list[str] | None = None, stage_dir: Path | None = None) -> int:
    """One module's wheel (target), or setup_py's project wheel (staged in stage_dir) with the modules of targets."""
    try:
        if setup_py is None:
            wheel = build(config, actions, config.parent, target)
        else:
            from pp4.wheel import project  # setup.py projects only: it brings the setup.py reader
            wheel = project.build(config, actions, config.parent, setup_py, targets or [], stage_dir)
    except (WheelError, CertificateError, PinError) as e:
        print(f"pp4.wheel: error: {e}", file=sys.stderr)
        return 1
    path = dist_dir / wheel.filename
    for said in (replace_old(stamp, path, wheel.version), replacing_same_name(path, wheel.data)):
        if said:
            print(f"pp4.wheel: {said}")
    written = write_if_changed(path, wheel.data)
    digest = hashlib.sha256(wheel.data).hexdigest()
    write_if_changed(stamp, json.dumps({"target": target, "wheel": str(path), "sha256": digest, "size": len(wheel.data),
                                        "distribution": wheel.distribution, "version": wheel.version}, indent=1) + "\n")
    print(f"wheel {path}: {human_bytes(len(wheel.data))}, sha256 {digest}" + ("" if written else " (unchanged)"))
    return 0


def stage(config: Path, setup_py: Path, stage_dir: Path, targets: list[str]) -> int:
    """A setup.py project's wheel without its modules, made while they build."""
    from pp4.sources.extensions import ExtensionError
    from pp4.wheel import project

    # Off the critical path: on a machine whose cores all compile, it waits for an idle moment
    # instead of taking a compile's share.
    os.nice(19)
    try:
        project.stage(config.parent, setup_py, targets, stage_dir)
    except (WheelError, ExtensionError) as e:
        print(f"pp4.wheel: error: {e}", file=sys.stderr)
        return 1
    return 0


def pack_built(config: Path, actions: Path, dist_dir: Path) -> int:
    builddir = config.parent
    built, missing = built_targets(builddir, actions)
    failed = 0
    for target in built:
        failed |= pack(config, actions, target, dist_dir, Path(wheel_stamp_path(str(builddir), target)))
    if missing:
        print(f"pp4.wheel: not built, so not packed: {', '.join(missing)} (`ninja wheel` builds and packs every "
              f"configured module; `ninja wheel-TARGET` one)")
    if not built:
        print("pp4.wheel: no module is built yet: nothing packed")
    return failed


@interrupt.command("pp4.wheel")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--built"] and len(argv) == 4:
        return pack_built(Path(argv[1]), Path(argv[2]), Path(argv[3]))
    if argv[:1] == ["--project-stage"] and len(argv) >= 5:
        config, setup_py, stage_dir, *targets = argv[1:]
        return stage(Path(config), Path(setup_py), Path(stage_dir), targets)
    if argv[:1] == ["--project"] and len(argv) >= 8:
        config, actions, setup_py, stage_dir, dist_dir, stamp, *targets = argv[1:]
        return pack(Path(config), Path(actions), " ".join(targets), Path(dist_dir), Path(stamp), Path(setup_py), targets,
                    Path(stage_dir))
    if len(argv) != 5:
        print("usage: python -m pp4.wheel CONFIG ACTIONS TARGET DIST_DIR STAMP\n"
              "       python -m pp4.wheel --built CONFIG ACTIONS DIST_DIR\n"
              "       python -m pp4.wheel --project-stage CONFIG SETUP_PY STAGE_DIR TARGET...\n"
              "       python -m pp4.wheel --project CONFIG ACTIONS SETUP_PY STAGE_DIR DIST_DIR STAMP TARGET...",
              file=sys.stderr)
        return 2
    config, actions, target, dist_dir, stamp = argv[0], argv[1], argv[2], Path(argv[3]), Path(argv[4])
    return pack(Path(config), Path(actions), target, dist_dir, stamp)


if __name__ == "__main__":
    sys.exit(main())
