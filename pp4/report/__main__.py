"""python -m pp4.report [--build DIR] [--trace FILE] [--svg FILE] [--summary]

What the last `ninja` run in this folder did (pp4/report/timeline.py): one summary line (edges,
wall, compiled with their CPU, restored by tier, the critical path), a trace file that Perfetto
(ui.perfetto.dev) and chrome://tracing open, and a picture of the timeline (SVG, and a PNG beside
it). `ninja report` runs it. Run it from the folder build.ninja is in."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pp4 import ninjarun
from pp4.files import write_if_changed
from pp4.report import picture, timeline


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pp4.report", description=__doc__.split("\n\n")[1])
    ap.add_argument("--build", default="build", help="the build folder (default: build)")
    ap.add_argument("--trace", help="where the trace file goes (default: BUILD/report.trace.json)")
    ap.add_argument("--svg", help="where the picture goes (default: BUILD/report.svg; its PNG beside it, .png)")
    ap.add_argument("--summary", action="store_true",
                    help="only the line, and never fail (what the certificate edge runs at the end of a build)")
    ap.add_argument("--if-asked-for", metavar="TARGET",
                    help="with --summary: only when the ninja running this asked for TARGET alone")
    ap.add_argument("--running", metavar="OUTPUT",
                    help="with --summary: the edge this runs in, counted though ninja has not logged it yet")
    args = ap.parse_args(argv)
    if args.if_asked_for is not None and ninjarun.requested_targets() != [args.if_asked_for]:
        return 0
    build = Path(args.build)
    try:
        ninja = ninjarun.ninja_ancestor() if args.running else None
        steps, path = timeline.load(".", str(build), ninjarun.binary(), args.running,
                                    ninjarun.started(ninja) if ninja is not None else None)
    except timeline.ReportError as e:
        print(f"pp4.report: {e}", file=sys.stderr)
        return 0 if args.summary else 2
    line = timeline.summary(steps, path)
    if args.summary:
        print(line)
        return 0
    trace = Path(args.trace or build / "report.trace.json")
    vector = Path(args.svg or build / "report.svg")
    write_if_changed(trace, json.dumps(picture.chrome_trace(steps, path), indent=0) + "\n")
    write_if_changed(vector, picture.svg(steps, path, line.removeprefix("pp4: ")))
    pixels = vector.with_suffix(".png")
    write_if_changed(pixels, picture.png(steps, path, line.removeprefix("pp4: ")))
    print(line)
    print(f"pp4: trace {trace} (open it in ui.perfetto.dev or chrome://tracing); pictures {vector} and {pixels}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
