"""pp4 at other git revisions beside this checkout, for benches that compare revisions in one run."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@contextmanager
def with_revisions(revisions: list[str], prefix: str):
    """Yield (scratch folder, [(name, checkout)]): this checkout first, then a detached worktree per
    revision under the scratch folder; all of it is removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    checkouts = [("HEAD (this checkout)", REPO)]
    try:
        for rev in revisions:
            wt = tmp / f"rev-{rev}"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(wt), rev], check=True)
            checkouts.append((rev, wt))
        yield tmp, checkouts
    finally:
        for _, path in checkouts[1:]:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
