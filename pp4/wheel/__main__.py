"""`ninja wheel` (or `ninja wheel-TARGET`) runs this for each module:

    python -m pp4.wheel CONFIG ACTIONS TARGET DIST_DIR STAMP

It writes DIST_DIR/<distribution>-<version>-<tag>.whl, only when its bytes change, and STAMP
(build/TARGET/wheel.json: the wheel's name and sha256), which is what ninja tracks since the wheel's
name holds the source key. The wheel the stamp named before is removed when this one replaces it
and its bytes are still the ones pp4 wrote.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from pp4 import interrupt
from pp4.certify.certificate import CertificateError
from pp4.certify.pin import PinError
from pp4.files import sha256_file, write_if_changed
from pp4.sizes import human_bytes
from pp4.wheel.contents import WheelError, build


def replace_old(stamp: Path, new_wheel: Path) -> None:
    try:
        old = json.loads(stamp.read_text())
        old_wheel = Path(old["wheel"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    if old_wheel != new_wheel and old_wheel.is_file() and sha256_file(old_wheel) == old.get("sha256"):
        old_wheel.unlink()


@interrupt.command("pp4.wheel")
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 5:
        print("usage: python -m pp4.wheel CONFIG ACTIONS TARGET DIST_DIR STAMP", file=sys.stderr)
        return 2
    config, actions, target, dist_dir, stamp = argv[0], argv[1], argv[2], Path(argv[3]), Path(argv[4])
    try:
        wheel = build(Path(config), Path(actions), Path(config).parent, target)
    except (WheelError, CertificateError, PinError) as e:
        print(f"pp4.wheel: error: {e}", file=sys.stderr)
        return 1
    path = dist_dir / wheel.filename
    replace_old(stamp, path)
    written = write_if_changed(path, wheel.data)
    digest = hashlib.sha256(wheel.data).hexdigest()
    write_if_changed(stamp, json.dumps({"target": target, "wheel": str(path), "sha256": digest, "size": len(wheel.data),
                                        "distribution": wheel.distribution, "version": wheel.version}, indent=1) + "\n")
    print(f"wheel {path}: {human_bytes(len(wheel.data))}, sha256 {digest}" + ("" if written else " (unchanged)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
