"""What one compile edge of build.ninja runs (`python -m pp4.reuse CONFIG --env ... -- COMPILER ARGS`):
claim the object the prepass restored, else look it up in the store (pp4/reuse/wrapper.py), else
compile it in the fixed root, observed (here or on a cluster node), and store it. Every path ends
with the object's event."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import attrs

from pp4.build import events
from pp4.reuse import actionkey, observations, timemacros
from pp4.reuse.notices import env_notices, machine_notices, notify_once
from pp4.build.config import ReuseConfig
from pp4.reuse.wrapper import MARKER_SUFFIX, Action, Reuser, signed_part


def compile_one(cfg: ReuseConfig, env: dict[str, str], argv: list[str]) -> int:
    args = actionkey.parse_compile(argv)
    marker = Path(args.output + MARKER_SUFFIX)
    if marker.exists():  # the prepass of this build restored it already
        marker.unlink()
        return 0
    from pp4.build import reporter  # here: an edge whose object the prepass restored has no run to report

    events.mark_run(cfg.state_dir)  # where this run starts in ninja's log, for the report
    reporter.ensure_running(cfg.state_dir)
    notify_once(cfg.state_dir, env_notices(cfg.folded))
    reuser = Reuser(cfg)
    t0 = time.monotonic()
    action = reuser.action(args, env)
    found = reuser.find(action)
    if found is not None and reuser.materialize(found[0], found[1]):
        events.write(cfg.state_dir, reuser.hit_event(found[1], found[0], time.monotonic() - t0, via="wrapper"))
        reuser.hasher.save()
        reuser.note_refusals()
        return 0
    try:
        return _lookups_then_compile(cfg, reuser, action, t0)
    finally:
        reuser.hasher.save()
        reuser.note_refusals()


def _lookups_then_compile(cfg: ReuseConfig, reuser: Reuser, action: Action, t0: float) -> int:
    """Under the command's compile lock: the lookup again when the same command was compiling
    elsewhere, another variant's object where it is proven this one's, else the compile."""
    with reuser.compile_lock(action) as waited:
        if waited:  # the same command was compiling elsewhere (another build folder, another variant)
            hit = reuser.lookup(action)
            if hit is not None and reuser.materialize(hit, action):
                events.write(cfg.state_dir,
                             reuser.hit_event(action, hit, time.monotonic() - t0, via="wrapper, after the same compile"))
                return 0
        shared = reuser.lookup_variant(action)
        if shared is not None and reuser.materialize(shared, action):
            adopted = reuser.adopt(action, shared)
            event = reuser.hit_event(action, shared, time.monotonic() - t0,
                                     via="wrapper, from another variant's compile: its preprocessing reads none of "
                                         + ", ".join(cfg.name_macros))
            if adopted is not None:  # the event names the entry kept under this command, and its signatures
                event = attrs.evolve(event, action_key=adopted.action_key, signatures=list(adopted.signatures),
                                     signed_payload=signed_part(adopted.payload))
            events.write(cfg.state_dir, event)
            return 0
        return _compile(cfg, reuser, action)


def _compile(cfg: ReuseConfig, reuser: Reuser, action: Action) -> int:
    args = action.args
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() or out.is_symlink():
        out.unlink()  # never write through a link that may share its inode with a stored object
    if cfg.executor:  # imported only then: every compile's wrapper starts without it
        from pp4.reuse.cluster.executor import ClusterExecutor

        cluster = ClusterExecutor.from_config(cfg.executor, cfg.state_dir)
        done = cluster.run(action, cfg.root_for(args.source), reuser.limits, reuser.states) if cluster else None
        if done is not None:
            reuser.write_depfile(action, done.observations)
            stored = reuser.store_compile(action, done.observations, timemacros.problem(done.time_macros, action.env),
                                          done.duration_s)
            reuser.event(action, status="compiled", compile_duration_s=done.duration_s, executed_on=done.node, **stored)
            return 0
    from pp4.execution.run import run  # here, not at the top: an edge that restores never runs a compiler

    ran = run(list(args.argv), action.env, reuser.limits, cfg.runs_dir(), action.root)
    hidden = observations.hidden_by_root(ran, action.outputs())
    beside = observations.writes_beside_itself(ran) if ran.returncode == 0 else None
    if hidden or beside:
        if hidden:
            (path, mounted), more = hidden[0], len(hidden) - 1
            why = (f"looked for {path}{f' (and {more} more)' if more else ''}, which pp4's fixed execution root hides: "
                   f"a link or `..` leads above {mounted}, which the root shows alone (docs/reuse.md)")
            share = ("; to share it between checkouts, make the extension's root a folder above both (in a spec file: "
                     "root = \"..\")")
        else:
            why, share = f"names the folder it is compiled in: {beside}", ""
        print(f"pp4: notice: {args.source} {why}. Compiled outside the root instead, so its object is keyed on this "
              f"checkout's folders{share}", file=sys.stderr)
        action = reuser.action(args, action.env, outside_root=why)
        if out.exists():
            out.unlink()
        ran = run(list(args.argv), action.env, reuser.limits, cfg.runs_dir(), None)
    sys.stderr.buffer.write(ran.root.shown(ran.stderr) if ran.root is not None else ran.stderr)
    sys.stderr.flush()
    notify_once(cfg.state_dir, machine_notices(reuser.root_problem, ran))
    if ran.returncode != 0:
        return ran.returncode
    pairs, problem = reuser.observations(action, ran)
    reuser.write_depfile(action, pairs, ran)
    stored = reuser.store_compile(action, pairs, problem, ran.seconds, warnings=ran.stderr)
    reuser.event(action, status="compiled", compile_duration_s=round(ran.seconds, 3), compile_cpu_s=ran.cpu_seconds,
                 missed=reuser.missed, not_shared=reuser.shared_refused, **stored)
    return 0
