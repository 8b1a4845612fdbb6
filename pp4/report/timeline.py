"""What the last `ninja` run did, edge by edge: when each output was built (ninja's own log), how
(pp4's compile events: compiled here, restored from the local or the remote store), and the chain
of edges the run waited on (the critical path). `python -m pp4.report` prints it in one line and
draws it (pp4/report/picture.py)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import attrs

from pp4 import ninjarun, statedir
from pp4.build import config as buildconfig
from pp4.build import events
from pp4.sizes import counted, human_duration

# Targets that report on a build rather than build: a run of only these is not "the last build".
REPORTING = {"report", "certify", "wheel-built"}
# The checks every ninja run makes before it decides (pp4/reuse/recheck.py, and the folded
# environment's, pp4/configure/environment.py): not steps of a build, and a run that only checked
# (`ninja report` after a build) is not "the last build" either.
CHECKS = tuple(f"/{statedir.FOLDER}/{name}" for name in (statedir.RECHECK_STAMP, statedir.ENVIRONMENT))


@attrs.frozen
class Step:
    output: str
    start_s: float  # from the run's start
    end_s: float
    how: str  # "compiled", "restored, local", "restored, remote" or "other" (pp4/report/picture.py colours each)
    cpu_s: float | None = None  # a compile's process tree, where its event says
    not_stored: str | None = None  # compiled and kept out of the store: why, as its event says

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


class ReportError(Exception):
    pass


def last_build(log: bytes, marks: list[events.RunMark], current: str | None = None) -> list[tuple[float, float, str, str]]:
    """(start s, end s, output, command hash) of the last build in a .ninja_log: the lines of the
    last run that built something, from where the run marks (pp4/build/events.py) say each run
    starts; current: the run (ninjarun.run_id) the caller is an edge of, which is the one meant
    where it marked. A run that only reported or checked (`ninja report`) is not the last build.
    Within a run's part of the log, and where no mark holds (a build folder of an older pp4, a log
    ninja rewrote), the log's own order separates runs (last_run): a run that no pp4 edge ran in
    (`ninja compile_commands.json`) follows the marked one before it."""
    valid: list[events.RunMark] = []
    for m in marks:
        if any(v.run == m.run for v in valid) or not m.holds(log):
            continue
        while valid and valid[-1].log_offset > m.log_offset:  # the log was rewritten between
            valid.pop()
        valid.append(m)
    ends = [m.log_offset for m in valid[1:]] + [len(log)]
    parts = [(m, log[m.log_offset:end].decode(errors="replace")) for m, end in zip(valid, ends)]
    mine = [text for m, text in parts if m.run == current]
    if mine:
        return last_run(mine[0])
    for _, text in reversed(parts):
        run = last_run(text)
        if run:
            return run
    return last_run(log[:valid[0].log_offset if valid else len(log)].decode(errors="replace"))


def last_run(log_text: str) -> list[tuple[float, float, str, str]]:
    """(start s, end s, output, command hash) of the last run in a .ninja_log (v5 to v7), by the
    log's own order alone: ninja appends an edge's line when it ends, with times from that run's
    start, so within a run the ends never go down, and a line ending before the one above it
    starts another run. (A short run right after another whose lines all end later than the one
    before's last is not told apart: last_build's run marks do that.)"""
    run: list[tuple[float, float, str, str]] = []
    last_end = None
    for line in log_text.splitlines():
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) < 5 or not fields[0].isdigit() or not fields[1].isdigit():
            continue
        start, end, output = int(fields[0]) / 1000, int(fields[1]) / 1000, fields[3]
        if output in REPORTING or output.endswith(CHECKS):
            continue
        if last_end is not None and end < last_end:
            run = []
        run.append((start, end, output, fields[4]))
        last_end = end
    return run


def graph_inputs(ninja: str, work: str) -> dict[str, set[str]]:
    """Each output's direct inputs, from `ninja -t graph` (build.ninja's edges and the
    dependencies ninja recorded from depfiles)."""
    proc = subprocess.run([ninja, "-C", work, "-t", "graph"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ReportError(f"`ninja -t graph` failed in {work}: {proc.stderr.strip()[:300]}")
    labels: dict[str, str] = {}
    rules: set[str] = set()
    arrows: list[tuple[str, str, bool]] = []
    for line in proc.stdout.splitlines():
        m = re.match(r'"([^"]+)" \[label="((?:[^"\\]|\\.)*)"(, shape=ellipse)?\]$', line)
        if m:
            labels[m.group(1)] = m.group(2).replace('\\"', '"')
            if m.group(3):
                rules.add(m.group(1))
            continue
        m = re.match(r'"([^"]+)" -> "([^"]+)"( \[label="[^"]*"\])?', line)
        if m:
            arrows.append((m.group(1), m.group(2), m.group(3) is not None))
    inputs: dict[str, set[str]] = {}
    into_rule: dict[str, set[str]] = {}
    for a, b, direct in arrows:
        if b in rules:
            into_rule.setdefault(b, set()).add(a)
    for a, b, direct in arrows:
        if a in rules and b in labels:
            inputs.setdefault(labels[b], set()).update(labels[i] for i in into_rule.get(a, ()) if i in labels)
        elif direct and a in labels and b in labels:  # an edge of one input, drawn as one arrow
            inputs.setdefault(labels[b], set()).add(labels[a])
    return inputs


def steps_of(run: list[tuple[float, float, str, str]], state_dir: str) -> list[Step]:
    """One step per edge: an edge of several outputs (configure's) has a line for each, in a row,
    with the same times and command. (Two edges can share their times: claims of restored objects
    take less than the log's millisecond.)"""
    known = events.Events(state_dir)
    steps = []
    edges = []
    for start, end, output, command in run:
        if edges and edges[-1][:2] == (start, end) and edges[-1][3] == command:
            continue
        edges.append((start, end, output, command))
    for start, end, output, _ in edges:
        ev = known.get(output)
        if ev is None:
            how, cpu = "other", None
        elif ev.status == "compiled":
            how, cpu = "compiled", ev.compile_cpu_s
        else:
            how, cpu = f"restored, {ev.tier or 'local'}", None
        steps.append(Step(output, start, end, how, cpu, ev.not_stored if how == "compiled" else None))
    return steps


def critical_path(steps: list[Step], inputs: dict[str, set[str]]) -> list[Step]:
    """The longest chain of edges of the run, each an input of the next (through phony targets,
    which take no time) and done before the next started, by the sum of their durations: the wall
    time no number of jobs would have gone below (Bazel's critical path). In a build that waited on
    job slots rather than on inputs, it is not the chain of whatever happened to end last."""
    by_output = {s.output: s for s in steps}
    longest: dict[int, tuple[float, list[Step]]] = {}

    def chain_to(step: Step) -> tuple[float, list[Step]]:
        if id(step) not in longest:
            best: tuple[float, list[Step]] = (0.0, [])
            for before in (by_output[i] for i in _built_inputs(step.output, inputs, by_output)):
                if before is not step and before.end_s <= step.start_s + 0.5:
                    best = max(best, chain_to(before), key=lambda c: c[0])
            longest[id(step)] = (best[0] + step.seconds, best[1] + [step])
        return longest[id(step)]

    if not steps:
        return []
    return max((chain_to(s) for s in steps), key=lambda c: c[0])[1]


def summary(steps: list[Step], path: list[Step]) -> str:
    if not steps:
        return "pp4: report: ninja's log has no build yet"
    wall = max(s.end_s for s in steps) - min(s.start_s for s in steps)
    compiled = [s for s in steps if s.how == "compiled"]
    cpu = sum(s.cpu_s or 0.0 for s in compiled)
    restored = {t: sum(s.how == f"restored, {t}" for s in steps) for t in ("local", "remote")}
    longest = max(path, key=lambda s: s.seconds) if path else None
    # A compile kept out of the store is compiled again by every build: say so where it is seen.
    unstored = [s for s in compiled if s.not_stored]
    return (f"pp4: last build: {counted(len(steps), 'edge')} in {human_duration(wall)}; compiled {len(compiled)}"
            + (f" ({human_duration(cpu)} of CPU)" if compiled else "")
            + (f", {len(unstored)} of them not stored (first, {unstored[0].output}: {unstored[0].not_stored[:160]})"
               if unstored else "")
            + f", restored {restored['local']} from the local store and {restored['remote']} from the remote one; "
            + f"critical path {counted(len(path), 'edge')}, {human_duration(sum(s.seconds for s in path))}"
            + (f" (longest: {longest.output}, {human_duration(longest.seconds)})" if longest else ""))


def with_running(steps: list[Step], inputs: dict[str, set[str]], output: str, now_s: float) -> list[Step]:
    """The steps and the edge that is running now, which ninja logs only once it has ended: the
    edge that says what the build did (the certificate's, a pin's) counts itself, as `ninja report`
    after the build counts it. It started when the last of its inputs ended (ninja starts an edge
    once its inputs are done, and this one waits for every edge it reports on); it ends now."""
    if any(s.output == output for s in steps):
        return steps
    ends = {s.output: s.end_s for s in steps}
    start = max([ends[i] for i in _built_inputs(output, inputs, ends)] or [max(ends.values(), default=0.0)])
    return [*steps, Step(output, start, max(start, now_s), "other")]


def _built_inputs(output: str, inputs: dict[str, set[str]], built, seen: set[str] | None = None) -> list[str]:
    """The inputs of output that an edge of the run built, through phony targets and files no edge
    of this run made."""
    seen = set() if seen is None else seen
    found = []
    for i in inputs.get(output, ()):
        if i in seen:
            continue
        seen.add(i)
        found += [i] if i in built else _built_inputs(i, inputs, built, seen)
    return found


def load(work: str, build_dir: str, ninja: str, running: str | None = None,
         ninja_started: float | None = None) -> tuple[list[Step], list[Step]]:
    """The last run's steps and its critical path, for the build folder `build_dir` of `work`;
    with `running`, the edge this runs in (with_running), ninja having started at ninja_started."""
    log = Path(build_dir) / events.NINJA_LOG
    try:
        text = log.read_bytes()
    except OSError as e:
        raise ReportError(f"no ninja log in {build_dir} ({e.strerror}): run `ninja` first") from e
    try:
        state_dir = buildconfig.load(build_dir).state_dir
    except buildconfig.BuildFolderError as e:
        raise ReportError(str(e)) from e
    # The edge that reports as the build ends (`--running`) is part of the run it reports on.
    current = ninjarun.run_id() if running is not None else None
    steps = steps_of(last_build(text, events.read_runs(state_dir), current), state_dir)
    inputs = graph_inputs(ninja, work)
    if running is not None and ninja_started is not None:
        steps = with_running(steps, inputs, running, time.time() - ninja_started)
    return steps, critical_path(steps, inputs)
