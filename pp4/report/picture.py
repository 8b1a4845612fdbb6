"""The last build drawn (pp4/report/timeline.py's steps and critical path): a trace file (Perfetto,
chrome://tracing), and a timeline picture as SVG and as PNG, one lane per edge running at once,
the critical path marked, every bar wide enough labelled and the rest grouped by module."""

from __future__ import annotations

import html
import os
import struct
import zlib

import attrs

from pp4.report.timeline import Step

COLOURS = {"compiled": "#d9534f", "restored, local": "#5cb85c", "restored, remote": "#5bc0de", "other": "#999999"}
KEY = {"other": "link, pin, check or certificate"}  # the colour key's words where the name alone says little


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
        args = {"how": what(step), "critical path": step.output in on_path}
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


# The build's own edges, by their output's name: what each is, in one word (a row of the picture).
OWN_EDGES = {"prepass.stamp": "prepass", "recheck.stamp": "recheck", ".pp4-toolchain.json": "toolchain",
             "build.ninja": "configure", "compile_commands.json": "compdb"}


def module_of(output: str) -> str:
    """The row an edge is counted in: build/MODULE/... belongs to MODULE; the build's own edges are
    named for what they do (prepass, recheck, toolchain, configure, certificate)."""
    parts = output.split("/")
    name = parts[-1]
    if name in OWN_EDGES:
        return OWN_EDGES[name]
    if not output.startswith("/") and len(parts) >= 3 and not parts[1].startswith("."):
        return parts[1]
    return name.split(".")[0] or name


def what(step: Step) -> str:
    """What an edge did, in words: how an object was made, else which module it linked or pinned."""
    if step.how != "other":
        return step.how
    module = module_of(step.output)
    if step.output.endswith(".pin.json"):
        return f"pin of {module}"
    if step.output.endswith(".so"):
        return f"link of {module}"
    return module


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
                         f"{step.output}: {what(step)}, {step.seconds:.1f} s"))
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
        labels.append(Label(x + 14, y + 9, KEY.get(how, how)))
        x += 24 + CHAR_W * len(KEY.get(how, how))
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
