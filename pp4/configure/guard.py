"""Whether writing build.ninja here would replace another build's."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from pp4.plan import ninjafile

GENERATED_MARK = "# " + ninjafile.GENERATED


def other_configuration(root: Path, builddir: Path, rerun: str = "python -m pp4.configure") -> str | None:
    """Why writing build.ninja here would replace another build, if it would: a build.ninja that is
    not pp4's, or pp4's for another build folder that still holds its configuration (a second
    configure here with another --builddir once replaced the first one's silently: issue 55). rerun:
    the command line that runs configure, as the message tells it."""
    path = root / "build.ninja"
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{path} cannot be read ({e.strerror}), so configure cannot tell whose it is; move it away first"
    if not text.startswith(GENERATED_MARK):
        return (f"{path} was not written by pp4's configure.py (its first line is not {GENERATED_MARK!r}): writing "
                "this build's would replace it. Run configure in another folder (build.ninja goes in the current "
                "folder), or pass --replace to replace it")
    variables = ninjafile.read_variables(text)
    if "config" not in variables:
        return None  # pp4's, from before build.ninja named its configuration: nothing to compare
    config = Path(shlex.split(variables["config"])[0])
    old_builddir = config.parent
    if old_builddir == builddir or not config.is_file():
        return None  # the same build, or one whose build folder is gone: nothing to keep
    args = variables.get("configure_args", "")
    shown = os.path.relpath(old_builddir, root) if old_builddir.is_relative_to(root) else str(old_builddir)
    return (f"{path} is the build of another configuration, --builddir {shown} (configured with: {args}); "
            f"writing this one's (--builddir {os.path.relpath(builddir, root) if builddir.is_relative_to(root) else builddir}) "
            "would replace it, and ninja here would build this one only. To keep both, run configure in another "
            "folder (build.ninja goes in the current folder, objects under --builddir): "
            f"mkdir ../other && cd ../other && {rerun} ... --builddir DIR. To replace it, "
            "pass --replace (its build folder stays on disk)")

