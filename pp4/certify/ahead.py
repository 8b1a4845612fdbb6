"""The edges after the compiles, done by the prepass where it restored everything they depend on.

Where the prepass restored every object of a module in this ninja run, nothing upstream of the
module's link is left for ninja to do: the prepass restores the module from the store (the link
edge's own lookup and checks, pp4/reuse/link.py), writes its pin, and, where it did so for every
module of the build, the certificate. One Python process does what four more would. Each such edge
then only claims what was done for it: its command first reads a marker, <output>.pp4-ahead, that
names this ninja process and holds what the edge would have said, and says it; it runs in full
where the marker is missing or names another ninja run (one whose edge was not asked for then, and
whose inputs may have changed since).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pp4.sizes import counted
from pp4 import ninjarun
from pp4.certify import certificate, pin
from pp4.execution.root import Root
from pp4.files import write_whole
from pp4.reuse.link import Linker

AHEAD_SUFFIX = ".pp4-ahead"


def mark(output: str, ninja_pid: int, said: list[str]) -> None:
    write_whole(Path(output + AHEAD_SUFFIX), "".join(f"{line}\n" for line in [str(ninja_pid), *said]).encode())


def clear(outputs) -> None:
    """Markers an earlier run left unclaimed: harmless (another run's pid), removed for tidiness."""
    for out in outputs:
        Path(out + AHEAD_SUFFIX).unlink(missing_ok=True)


def ahead(config_path: Path, actions_path: Path, reuser, doc: dict, restored: set[str], started: float,
          restored_by_tier: dict[str, int]) -> None:
    """doc: actions.json's content; restored: the objects this prepass put in place in this ninja run."""
    links = doc.get("links") or []
    clear([*(ln[k] for ln in links for k in ("output", "pin")), *([doc["certificate"]] if doc.get("certificate") else [])])
    ninja_pid = ninjarun.ninja_ancestor()
    if ninja_pid is None or reuser.front is None:
        return  # run by hand: no edge of a ninja run to claim these
    asked = ninjarun.requested_targets()
    cfg = reuser.cfg
    root = Root.make(os.getcwd(), cfg.places, build=cfg.builddir())  # every link's, as the link edge makes it
    done = 0
    for link in links:
        if not link["objects"] or not all(o in restored for o in link["objects"]) or os.path.exists(link["output"]):
            continue
        linker = Linker.for_reuser(reuser, root, link["argv"], link["env"], link["output"])
        if linker is None or not linker.restore():
            continue
        mark(link["output"], ninja_pid, [])
        said = [pin.said(pin.write(Path(link["plan"]), Path(link["output"]), Path(link["pin"])))]
        if asked == [link["target"]]:
            said.append(summary(restored, restored_by_tier, 1, started))
        mark(link["pin"], ninja_pid, said)
        done += 1
    # The certificate only where this run's certificate edge will claim it (`ninja`, `ninja all`, or
    # the file asked for): EXL3's takes a second to write, for nothing after `ninja exl3`.
    wanted = asked is not None and (asked in ([], ["all"]) or doc.get("certificate") in asked)
    if done and done == len(links) and doc.get("certificate") and wanted:
        said: list[str] = []
        # the sets as this process read them from the store, each checked against its name, which
        # is also its name in the build's state folder
        certificate.write(config_path, actions_path, Path(doc["certificate"]), say=said.append,
                          read_set=lambda pack, sid: reuser.sets.load(reuser.state_sets, pack, sid))
        mark(doc["certificate"], ninja_pid, [*said, summary(restored, restored_by_tier, done, started)])


def summary(restored: set[str], by_tier: dict[str, int], modules: int, started: float) -> str:
    """The build's last line, where the prepass did everything: no edge after it had work."""
    tiers = " and ".join(f"{n} from the {tier} store" for tier, n in sorted(by_tier.items()) if n)
    return (f"pp4: this build restored everything before its edges ran: {counted(len(restored), 'object')} "
            f"({tiers}) and "
            f"{modules} module{'s' if modules != 1 else ''}, in {time.monotonic() - started:.1f} s")
