"""The prepass (`python -m pp4.reuse --prepass CONFIG ACTIONS STAMP`), which every compile edge
waits for: the lookups of all compiles whose object is missing, in one process (each path's state
worked out once), restoring the hits; each of those edges then only claims its object (a marker
left here), which costs a shell `test`, not a Python start-up. It also writes the stamp's
dependency file and keeps the build's state bounded."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pp4 import ninjarun
from pp4.execution import depfile
from pp4.execution.root import Root
from pp4.build import events
from pp4.reuse import actionkey, inputsets
from pp4.reuse.notices import env_notices, notify_once
from pp4.build.config import ReuseConfig
from pp4.reuse.wrapper import MARKER_SUFFIX, Reuser

STATE_SETS_GRACE_S = 3600.0


def prepass(cfg: ReuseConfig, actions_file: Path, stamp: Path, on_miss=None, after=None) -> int:
    """on_miss: called once unless this prepass restored every object of the build: a compile edge may
    run (it starts the compile server, which such a build never needs). after(reuser, planned,
    restored, started, restored_by_tier): the edges after the compiles that need nothing more
    (pp4/certify/ahead.py, which sits above the reuse rule and is handed in by the command)."""
    t0, cpu0 = time.monotonic(), time.process_time()
    events.mark_run(cfg.state_dir)  # where this run starts in ninja's log, for the report
    planned = json.loads(actions_file.read_text())
    actions = planned["actions"]
    notify_once(cfg.state_dir, env_notices(cfg.folded))
    reuser = Reuser(cfg)
    restored = 0
    hits: list[events.CompileEvent] = []
    put: set[str] = set()  # the objects restored, as the actions name them
    missing = []
    for doc in actions:
        args = actionkey.parse_compile(doc["argv"])
        marker = Path(args.output + MARKER_SUFFIX)
        if marker.exists():  # restored by an earlier prepass that never got claimed: start over
            for p in (marker, Path(args.output), Path(args.depfile)):
                p.unlink(missing_ok=True)
        if Path(args.output).exists():
            continue  # ninja decides about existing objects; their edges run the full wrapper
        missing.append(reuser.action(args, doc["env"]))
    checked = len(missing)
    checked_actions = list(missing)
    # The local store first, each compile on its own; then what the remote tier holds for the rest,
    # all of them at once in a few round trips (pp4/store/front.py: prefetch), and the local store
    # again, which now holds it.
    rest = []
    for attempt in (1, 2):
        for action in missing:
            t = time.monotonic()
            found = reuser.find(action, remote=False)
            if found is not None and reuser.materialize(*found):
                hit, used = found
                Path(used.args.output + MARKER_SUFFIX).write_text(hit.entry.action_key + "\n")
                hits.append(reuser.hit_event(used, hit, time.monotonic() - t, via="prepass"))
                put.add(used.args.output)
                restored += 1
            else:
                rest.append(action)
        if attempt == 1 and rest and reuser.prefetch(rest):
            missing, rest = rest, []
        else:
            break
    if on_miss is not None and len(hits) < len(actions):  # some compile edge may run: a miss, or a stale object
        on_miss()
    reuser.hasher.save()
    reuser.note_refusals()
    # One batch file for all of them, after the markers: killed before it is in place, the markers
    # make the next prepass restore those objects again (pp4/build/events.py).
    batch = events.write_batch(cfg.state_dir, hits)
    # The stamp's dependencies: every file every compile seen so far read, so that an edit of any
    # of them runs the prepass again before the compiles that ninja will then find out of date.
    # (set, mapping) -> a pack that holds it: most sets are every unit's, each read once
    seen: dict[tuple[str, Root | None], str | None] = {}
    named: set[str] = set()  # the packs the events name
    known = events.Events(cfg.state_dir, batch)
    for doc in actions:
        ev = known.get(doc["output"])
        if ev is None:
            continue
        mapping = Root.from_mounts(ev.mounts) if ev.mounts else None
        if ev.sets_pack is not None:
            named.add(ev.sets_pack)
        for sid in ev.input_sets:
            seen.setdefault((sid, mapping), ev.sets_pack)
    deps: set[str] = set()
    for (sid, mapping), pack in seen.items():
        deps.update(reuser.sets.files(reuser.state_sets, pack, sid, mapping))
    # The build's state stays bounded: no compile edge runs before this prepass ends, so what no
    # configured output's event names now is no one's (sets get an hour: a build folder's other
    # ninja, run by hand at the same time, may have just written one).
    events.collect(cfg.state_dir, {doc["output"] for doc in actions}, batch)
    inputsets.collect(reuser.state_sets, named, older_than_s=STATE_SETS_GRACE_S)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    depfile.write(str(stamp) + ".d", str(stamp), sorted(deps))
    cpu = time.process_time() - cpu0
    stamp.write_text(json.dumps({"checked": checked, "restored": restored,
                                 "seconds": round(time.monotonic() - t0, 3), "cpu_seconds": round(cpu, 3),
                                 "input_sets": reuser.sets.loaded()}) + "\n")
    if after is not None:  # the link, pin and certificate edges where nothing is left before them (last,
        # so that the build's last line, which it writes, counts the whole prepass)
        after(reuser, planned, put, t0, {tier: sum(e.tier == tier for e in hits) for tier in ("local", "remote")})
    if checked:
        print(restored_line([a.args.output for a in checked_actions], put, hits, planned,
                            f" in {time.monotonic() - t0:.2f} s ({cpu:.2f} CPU-s)"))
    return 0


def restored_line(checked: list[str], put: set[str], hits: list[events.CompileEvent], planned: dict,
                  took: str) -> str:
    """What the prepass restored, counted among the objects the targets ninja was asked for need
    (all of the build's missing ones are looked up: a later `ninja` finds them in place)."""
    asked, name = ninjarun.asked_objects(ninjarun.requested_targets(), planned)
    remote = sum(e.tier == "remote" for e in hits if asked is None or e.output in asked)
    mine = [o for o in checked if asked is None or o in asked]
    others = len(checked) - len(mine)
    text = (f"pp4.reuse: {len(put.intersection(mine))} of {len(mine)} missing objects"
            + (f" of {name}" if asked is not None else "") + " restored from the store"
            + (f" ({remote} from the remote store)" if remote else "") + took)
    if others:
        text += f"; {len(put) - len(put.intersection(mine))} of {others} of other targets too"
    return text
