"""What the last `ninja` run did, edge by edge: when each output was built (ninja's own log), how
(pp4's compile events: compiled here, restored from the local or the remote store), and the chain
of edges the run waited on (the critical path). `python -m pp4.report` prints it in one line and
writes it as a trace file (Perfetto, chrome://tracing) and as a picture (SVG, and PNG)."""

from __future__ import annotations

import html
import os
import re
import struct
import subprocess
import time
import zlib
from pathlib import Path

import attrs

from pp4 import ninjarun
from pp4.build import config as buildconfig
from pp4.build import events
from pp4.sizes import human_duration

# Targets that report on a build rather than build: a run of only these is not "the last build".
REPORTING = {"report", "certify", "wheel-built"}
# The check every ninja run makes before it decides (pp4/reuse/recheck.py): not a step of a build,
# and a run that only checked (`ninja report` after a build) is not "the last build" either.
CHECK = "/.pp4/recheck.stamp"
COLOURS = {"compiled": "#d9534f", "restored, local": "#5cb85c", "restored, remote": "#5bc0de", "other": "#999999"}


@attrs.frozen
class Step:
    output: str
    start_s: float  # from the run's start
    end_s: float
    how: str  # a key of COLOURS
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
        if output in REPORTING or output.endswith(CHECK):
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
    return (f"pp4: last build: {len(steps)} edges in {human_duration(wall)}; compiled {len(compiled)}"
            + (f" ({human_duration(cpu)} of CPU)" if compiled else "")
            + (f", {len(unstored)} of them not stored (first, {unstored[0].output}: {unstored[0].not_stored[:160]})"
               if unstored else "")
            + f", restored {restored['local']} from the local store and {restored['remote']} from the remote one; "
            + f"critical path {len(path)} edges, {human_duration(sum(s.seconds for s in path))}"
            + (f" (longest: {longest.output}, {human_duration(longest.seconds)})" if longest else ""))


def lanes(steps: list[Step]) -> list[int]:
    """A lane for each step, none overlapping another in its lane (as ninja's jobs ran them)."""
    ends: list[float] = []
    lane_of = [0] * len(steps)
    for i in sorted(range(len(steps)), key=lambda i: (steps[i].start_s, steps[i].end_s)):
        free = next((k for k, e in enumerate(ends) if e <= steps[i].start_s + 1e-3), None)
        if free is None:
            ends.append(0.0)
            free = len(ends) - 1
        ends[free] = steps[i].end_s
        lane_of[i] = free
    return lane_of


def chrome_trace(steps: list[Step], path: list[Step]) -> dict:
    """The Trace Event Format's JSON object form: one complete event ("X") per edge."""
    on_path = {s.output for s in path}
    trace = []
    for step, lane in zip(steps, lanes(steps)):
        args = {"how": step.how, "critical path": step.output in on_path}
        if step.cpu_s is not None:
            args["cpu_s"] = step.cpu_s
        trace.append({"name": os.path.basename(step.output), "cat": step.how, "ph": "X", "pid": 1, "tid": lane,
                      "ts": round(step.start_s * 1e6), "dur": round(step.seconds * 1e6), "args": args})
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


@attrs.frozen
class Box:
    x: float
    y: float
    w: float
    h: float
    fill: str
    outlined: bool = False
    tip: str | None = None


@attrs.frozen
class Label:
    x: float
    y: float  # the baseline
    text: str
    end: bool = False  # anchored at its end (right-aligned)
    colour: str = "#000000"


# One monospace font for both pictures: the SVG's at 11 px advances 6.6 px a letter, the PNG's
# (pp4/report/font.py) 7; the layout counts 7, so what fits one fits the other.
CHAR_W, FONT_PX, ROW = 7, 11, 16
WIDTH, MARGIN = 1200, 10


def module_of(output: str) -> str:
    """build/MODULE/...: the module an output belongs to; the build's own files are "build"."""
    parts = output.split("/")
    return parts[1] if len(parts) >= 3 else "build"


def _wrap(text: str, chars: int) -> list[str]:
    lines, current = [], ""
    for word in text.split(" "):
        while len(word) > chars:  # a path longer than the line: cut it
            if current:
                lines.append(current)
                current = ""
            lines.append(word[:chars])
            word = word[chars:]
        if current and len(current) + 1 + len(word) > chars:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    return lines + ([current] if current else [])


def _tick_step(span: float) -> float:
    """A round step giving 6 to 12 ticks over span seconds."""
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200):
        if span / step <= 12:
            return step
    return 3600 * max(1, round(span / 3600 / 10))


def _tick_text(t: float, step: float) -> str:
    return f"{t:.1f} s" if step < 1 else f"{t:.0f} s" if step < 60 else f"{t / 60:.0f} min" if step < 3600 else f"{t / 3600:.0f} h"


def layout(steps: list[Step], path: list[Step], title: str) -> tuple[int, int, list[Box], list[Label]]:
    """The timeline as boxes and labels: each edge a bar in its lane, coloured by how it was made,
    the critical path outlined, named where its name fits in it; under the lanes one bar per module
    from its first edge's start to its last one's end, saying how many edges it had and how many of
    them are too narrow to be named; the time axis; the colours' key. The title wraps to the width."""
    chars = (WIDTH - 2 * MARGIN) // CHAR_W
    boxes: list[Box] = []
    labels = [Label(MARGIN, 16 + 14 * i, line) for i, line in enumerate(_wrap(title, chars))]
    top = 16 + 14 * len(labels)
    lane_of = lanes(steps) if steps else []
    on_path = {s.output for s in path}
    span = max([s.end_s for s in steps] + [1e-3])
    scale = (WIDTH - 2 * MARGIN) / span
    unnamed: dict[str, int] = {}
    for step, lane in zip(steps, lane_of):
        x, y = MARGIN + step.start_s * scale, top + lane * ROW
        w = max(step.seconds * scale - (1 if step.seconds * scale >= 3 else 0), 0.5)  # a gap to the next bar
        boxes.append(Box(x, y, w, ROW - 2, COLOURS[step.how], step.output in on_path,
                         f"{step.output}: {step.how}, {step.seconds:.1f} s"))
        name = os.path.basename(step.output)
        fits = int((w - 4) // CHAR_W)
        if fits >= len(name):
            labels.append(Label(x + 2, y + ROW - 5, name))
        elif fits >= 10:  # the front of the name, enough of it to say which unit it is
            labels.append(Label(x + 2, y + ROW - 5, name[:fits - 1] + "~"))
        else:
            unnamed[module_of(step.output)] = unnamed.get(module_of(step.output), 0) + 1
    y = top + (max(lane_of) + 1 if lane_of else 0) * ROW + 8
    modules: dict[str, list[Step]] = {}
    for step in steps:
        modules.setdefault(module_of(step.output), []).append(step)
    for name, group in sorted(modules.items(), key=lambda m: min(s.start_s for s in m[1])):
        x0, x1 = MARGIN + min(s.start_s for s in group) * scale, MARGIN + max(s.end_s for s in group) * scale
        boxes.append(Box(x0, y, max(x1 - x0, 0.5), ROW - 2, "#e8e8e8", False, f"{name}: {len(group)} edges"))
        text = f"{name}: {len(group)} edge{'s' if len(group) != 1 else ''}" + (
            f", {unnamed[name]} too short to name above" if unnamed.get(name) else "")
        if x0 + 2 + len(text) * CHAR_W <= WIDTH - MARGIN:
            labels.append(Label(x0 + 2, y + ROW - 5, text))
        else:
            labels.append(Label(min(x1, WIDTH - MARGIN) - 2, y + ROW - 5, text, end=True))
        y += ROW
    y += 4
    step = _tick_step(span)
    t = 0.0
    while t <= span + 1e-9:
        x, text = MARGIN + t * scale, _tick_text(t, step)
        boxes.append(Box(x, y, 1, 5, "#555555"))
        # the last one inside the picture: anchored at its end where it would run off the edge
        end = x + len(text) * CHAR_W > WIDTH - MARGIN
        labels.append(Label(x, y + 17, text, end=end, colour="#555555"))
        t = round(t + step, 6)
    y += 30
    x = MARGIN
    for how, colour in [*COLOURS.items(), ("critical path (outlined)", "#ffffff")]:
        boxes.append(Box(x, y, 10, 10, colour, how.startswith("critical")))
        labels.append(Label(x + 14, y + 9, how))
        x += 24 + CHAR_W * len(how)
    return WIDTH, int(y + 20), boxes, labels


def svg(steps: list[Step], path: list[Step], title: str) -> str:
    width, height, boxes, labels = layout(steps, path, title)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="DejaVu Sans Mono, monospace" font-size="{FONT_PX}">',
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>']
    for b in boxes:
        stroke = ' stroke="#000" stroke-width="1.5"' if b.outlined else ""
        tip = f"<title>{html.escape(b.tip)}</title>" if b.tip else ""
        out.append(f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{b.h:.1f}" fill="{b.fill}"{stroke}>{tip}</rect>')
    for lb in labels:
        anchor = ' text-anchor="end"' if lb.end else ""
        out.append(f'<text x="{lb.x:.1f}" y="{lb.y:.1f}" fill="{lb.colour}"{anchor}>{html.escape(lb.text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def png(steps: list[Step], path: list[Step], title: str) -> bytes:
    """The same layout as svg(), as pixels: boxes filled, outlines drawn, labels in
    pp4/report/font.py's letters; written with zlib alone."""
    from pp4.report import font

    width, height, boxes, labels = layout(steps, path, title)
    px = bytearray(b"\xff" * (width * height * 3))

    def rgb(colour: str) -> tuple[int, int, int]:
        return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)

    def fill(x0: int, y0: int, x1: int, y1: int, colour: tuple[int, int, int]) -> None:
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, width), min(y1, height)
        if x1 <= x0:
            return
        row = bytes(colour) * (x1 - x0)
        for y in range(y0, y1):
            px[(y * width + x0) * 3:(y * width + x1) * 3] = row

    for b in boxes:
        x0, y0 = round(b.x), round(b.y)
        x1, y1 = max(round(b.x + b.w), x0 + 1), max(round(b.y + b.h), y0 + 1)
        fill(x0, y0, x1, y1, rgb(b.fill))
        if b.outlined:
            black = (0, 0, 0)
            fill(x0, y0, x1, y0 + 1, black), fill(x0, y1 - 1, x1, y1, black)
            fill(x0, y0, x0 + 1, y1, black), fill(x1 - 1, y0, x1, y1, black)
    for lb in labels:
        colour = rgb(lb.colour)
        x = round(lb.x - (len(lb.text) * font.WIDTH if lb.end else 0))
        top = round(lb.y) - font.BASELINE
        for ch in lb.text:
            g = font.glyph(ch)
            for gy in range(font.HEIGHT):
                y = top + gy
                if not 0 <= y < height:
                    continue
                for gx in range(font.WIDTH):
                    a = g[gy * font.WIDTH + gx]
                    if a and 0 <= x + gx < width:
                        i = (y * width + x + gx) * 3
                        px[i:i + 3] = bytes((px[i + k] * (15 - a) + colour[k] * a) // 15 for k in range(3))
            x += font.WIDTH

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\0" + bytes(px[y * width * 3:(y + 1) * width * 3]) for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


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
