"""build/.pp4/: what a build keeps beside its outputs, one part per writer. Every part is named
here and nowhere else; each writer gets its path from `part()`.

    events/              one event per compile edge (how its object was made)   pp4/build/events.py
    prepass-events.json  the prepass's events, one batch                         pp4/build/events.py
    setpacks/            the set packs the build's events name                   pp4/reuse/inputsets.py
                         (named as the store's own: inputsets.directory)
    notices/             which ninja run printed the build's notices             pp4/reuse/wrapper.py
    compilers.json       the compilers' identities, by file stamp                pp4/toolchain/compilers.py
    remote/              the remote tier's password, refusals, back-off          pp4/store/remote/tier.py
    cluster/             the cluster's back-off                                  pp4/reuse/cluster/executor.py
    links/               what each module's link observed                        pp4/build/modules.py
    untrusted.log        stored entries not restored for who stored them          pp4/reuse/wrapper.py
    recheck.stamp        the check before ninja decides (restat: made once)        pp4/reuse/recheck.py
    recheck.stamp.ids    the identities the quick check compares on every run     pp4/reuse/quickcheck.py
    ninja.lock           the ninja run building in the folder (pid-starttime)     pp4/reuse/quickcheck.py
    prepass.stamp        the prepass's stamp and dependency file, for ninja       pp4/plan/ninjafile.py
    estimates.json       each object's estimated CPU seconds, its H200 figure, jobs configure.py
    source-folders.json  the names in a setup.py's source folders (ninja's stamp)  pp4/sources/listing.py
    environment.json     the environment variables configure folded (ninja's stamp) pp4/configure/environment.py
    progress.lock        held by the ninja run's progress reporter               pp4/report/progress.py
    progress.log         the run's progress lines                                 pp4/report/progress.py
    runs.log             where each ninja run starts in ninja's log               pp4/build/events.py

Bounds: events and sets are collected by every prepass (pp4/reuse/wrapper.py: the events of
outputs the build no longer has, the sets no event names); notices are
removed with their ninja run; progress.log holds one run's lines; runs.log the last runs' marks; the
rest are one file each.
"""

from __future__ import annotations

import os
from pathlib import Path

EVENTS = "events"
PREPASS_EVENTS = "prepass-events.json"
NOTICES = "notices"
COMPILERS = "compilers.json"
REMOTE = "remote"
CLUSTER = "cluster"
PREPASS_STAMP = "prepass.stamp"
RECHECK_STAMP = "recheck.stamp"
# Named again in pp4/reuse/quickcheck.py, which runs with only built-in modules (this one loads pathlib):
RECHECK_IDS = RECHECK_STAMP + ".ids"
NINJA_LOCK = "ninja.lock"
UNTRUSTED = "untrusted.log"
LINKS = "links"
ESTIMATES = "estimates.json"
SOURCE_LISTING = "source-folders.json"
ENVIRONMENT = "environment.json"
PROGRESS_LOCK = "progress.lock"
PROGRESS_LOG = "progress.log"
RUNS = "runs.log"

FOLDER = ".pp4"  # inside the build folder


def of_build(builddir: str | os.PathLike) -> Path:
    return Path(builddir) / FOLDER


def part(state_dir: str | os.PathLike, name: str) -> Path:
    return Path(state_dir) / name
