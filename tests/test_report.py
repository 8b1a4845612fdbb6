"""The report of a build (`ninja report`, pp4/report/timeline.py) on a real build of a C/C++ spec:
what it says is compiled, restored and waited on, against ninja's own record of the same run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

from conftest import REPO
from test_specs_build import configured, ninja_bin, run


def actions(work):
    return [a["output"] for a in json.loads((work / "build" / "actions.json").read_text())["actions"]]


def test_the_report_names_what_the_last_build_compiled_restored_and_waited_on(tmp_path, toolchain):
    _, work = configured(tmp_path)
    built = run([ninja_bin()], work).stdout
    objects = actions(work)
    # the build's last edge (the certificate) says what it did
    assert built.splitlines()[-1].startswith("pp4: last build: ") and f"compiled {len(objects)} (" in built, built

    cold = run([ninja_bin(), "report"], work).stdout
    line = next(ln for ln in cold.splitlines() if ln.startswith("pp4: last build:"))
    # One computation: the line the certificate edge printed, before ninja had logged that edge,
    # says what the report says after from ninja's log, the certificate counted in both.
    assert same_counts(built.splitlines()[-1], line), (built.splitlines()[-1], line)
    assert f"compiled {len(objects)} (" in line and "restored 0 from the local store" in line, line
    trace = json.loads((work / "build" / "report.trace.json").read_text())["traceEvents"]
    # ninja's own list of what that run built (-t recompact keeps the log's last record of each output)
    logged = {ln.split("\t")[3] for ln in (work / "build" / ".ninja_log").read_text().splitlines()[1:]}
    assert {e["name"] for e in trace} >= {o.rsplit("/", 1)[-1] for o in objects}
    assert all(o in logged for o in objects)
    compiled = [e for e in trace if e["cat"] == "compiled"]
    assert len(compiled) == len(objects) and all(e["args"]["cpu_s"] > 0 for e in compiled)
    on_path = [e for e in trace if e["args"]["critical path"]]
    # the chain ends at the edge that ended last and holds an object and the link that waited for it
    assert max(trace, key=lambda e: e["ts"] + e["dur"])["args"]["critical path"]
    assert any(e["cat"] == "compiled" for e in on_path) and any(e["name"].endswith(".so") for e in on_path)
    ET.fromstring((work / "build" / "report.svg").read_text())  # a well-formed picture
    from pp4.report import timeline

    steps, path = timeline.load(str(work), str(work / "build"), ninja_bin())
    assert check_picture(steps, path, line.removeprefix("pp4: "), tmp_path) >= 1
    assert (work / "build" / "report.png").read_bytes() == (tmp_path / "timeline.png").read_bytes()

    # Objects gone, the store warm: the next build restores them all, and the report says so.
    for o in objects:
        (work / o).unlink()
    run([ninja_bin()], work)
    warm = run([ninja_bin(), "report"], work).stdout
    assert re.search(rf"compiled 0, restored {len(objects)} from the local store", warm), warm
    again = run([ninja_bin(), "report"], work).stdout
    assert again.splitlines()[-2:] == warm.splitlines()[-2:], "a report run is not the last build"


def same_counts(during: str, after: str) -> bool:
    """Two summary lines agree: every count, and the times to within the last edge's own end
    (the line during the build is written before its edge ends)."""
    numbers = re.compile(r"(\d+(?:\.\d+)?) (s|min)\b")
    if numbers.sub("T", during) != numbers.sub("T", after):
        return False
    return all(abs(float(a) - float(b)) <= 0.5 + 0.1 * float(b) and ua == ub
               for (a, ua), (b, ub) in zip(numbers.findall(during), numbers.findall(after)))


def test_a_target_s_own_last_line_is_what_the_report_says_after(tmp_path, toolchain):
    """`ninja TARGET` ends with its pin edge's line; the report afterwards reads ninja's log, where
    that edge is now: the two agree on every count."""
    _, work = configured(tmp_path)
    built = run([ninja_bin(), "pp4_answer"], work).stdout
    during = next(ln for ln in built.splitlines() if ln.startswith("pp4: last build:"))
    after = next(ln for ln in run([ninja_bin(), "report"], work).stdout.splitlines() if ln.startswith("pp4: last build:"))
    assert same_counts(during, after), (during, after)
    assert re.search(r"critical path \d+ edges, .* \(longest: ", after) and ".pin.json" in (work / "build" / ".ninja_log").read_text()


def test_a_short_build_right_after_another_is_the_last_build_alone(tmp_path, toolchain):
    """Two builds in a row, the second short: ninja's log has no mark between runs, and where the
    second's lines all end later (from its own start) than the first's last, the log's order alone
    counts both as one run. The marks pp4's edges leave (pp4/build/events.py) say where the second
    starts: the report counts its edges alone, and `ninja report`, a run of its own, is not it."""
    project, work = configured(tmp_path)
    run([ninja_bin()], work)
    log = work / "build" / ".ninja_log"
    # The first: one pin written again, a few hundred milliseconds.
    pin = next((work / "build" / "pp4_answer").glob("*.pin.json"))
    pin.unlink()
    run([ninja_bin(), str(pin.relative_to(work))], work)
    before = log.read_text()
    # The second: a source changed; its prepass alone loads the reuse rule, then a compile, the link.
    source = project / "csrc" / "answer.cpp"
    source.write_text(source.read_text() + "\n// changed\n")
    run([ninja_bin(), "pp4_answer"], work)
    from pp4.report import timeline

    second = [ln.split("\t")[3] for ln in log.read_text()[len(before):].splitlines()
              if not ln.startswith("#") and not ln.split("\t")[3].endswith(timeline.CHECKS)]
    assert any(o.endswith(".pin.json") for o in second) and any(o.endswith("answer.cpp.o") for o in second), second
    report = run([ninja_bin(), "report"], work).stdout
    steps, _ = timeline.load(str(work), str(work / "build"), ninja_bin())
    assert sorted(s.output for s in steps) == sorted(second)
    assert f"pp4: last build: {len(second)} edges in " in report, report


def test_no_build_yet_is_said_plainly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pp4.report", "--build", str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "no ninja log" in proc.stderr and "run `ninja` first" in proc.stderr


def test_edges_that_share_their_times_are_each_an_edge(tmp_path):
    """Claims of restored objects take less than the log's millisecond, so two edges can have the
    same start and end: each is a step. One edge of several outputs (configure's: one command) is one."""
    from pp4.report import timeline

    log = ("# ninja log v6\n"
           "0\t40\t0\tbuild.ninja\taaaa\n0\t40\t0\tbuild/pp4.json\taaaa\n"
           "41\t41\t0\tbuild/x/obj/a.cpp.o\tbbbb\n41\t41\t0\tbuild/x/obj/b.cpp.o\tcccc\n"
           "41\t41\t0\tbuild/x/obj/c.cpp.o\tdddd\n42\t90\t0\tbuild/x/x.so\teeee\n")
    steps = timeline.steps_of(timeline.last_run(log), str(tmp_path))
    assert [s.output for s in steps] == ["build.ninja", "build/x/obj/a.cpp.o", "build/x/obj/b.cpp.o",
                                         "build/x/obj/c.cpp.o", "build/x/x.so"]


def test_the_critical_path_is_the_longest_chain_not_whatever_ended_last():
    """Two jobs, three units: the long one and a short one start at once, the second short one waits
    for a job slot, so it ends last, just before the link. The build could not have been shorter
    than the long unit and the link: that is the critical path, not the unit that waited for a slot."""
    from pp4.report.timeline import Step, critical_path

    long_unit = Step("a.o", 0.0, 100.0, "compiled")
    short = Step("b.o", 0.0, 2.0, "compiled")
    waited = Step("c.o", 98.0, 100.5, "compiled")
    link = Step("m.so", 100.5, 101.0, "other")
    inputs = {"m.so": {"a.o", "b.o", "c.o"}, "all": {"m.so"}}
    assert critical_path([long_unit, short, waited, link], inputs) == [long_unit, link]
    assert critical_path([], inputs) == []


def test_the_summary_says_which_compiles_were_kept_out_of_the_store():
    """A compile that is never stored is compiled by every build: the line after each build says
    how many and why the first was kept out, as its event says."""
    from pp4.report.timeline import Step, summary

    stored = Step("a.o", 0.0, 10.0, "compiled", 9.0)
    kept_out = Step("b.o", 0.0, 12.0, "compiled", 11.0, "it read /proc/uptime, which describes this machine or this run")
    restored = Step("c.o", 0.0, 0.1, "restored, local")
    line = summary([stored, kept_out, restored], [kept_out])
    assert "compiled 2 (20 s of CPU), 1 of them not stored (first, b.o: it read /proc/uptime, " in line, line
    assert "not stored" not in summary([stored, restored], [stored])



def synthetic_build(tmp_path, edges: int, jobs: int):
    """A ninja log of `edges` compiles in four modules on `jobs` lanes, then their links, through
    the report's own reading of a log (last_run, steps_of): a build this machine could not run in
    a test's time, for the picture."""
    import random

    from pp4.report import timeline

    rng = random.Random(55)
    modules = ["exl3", "p2p", "exl3_facc", "ext"]
    lines, slots, inputs = ["# ninja log v7"], [0.0] * jobs, {}
    for i in range(edges - len(modules)):
        module = modules[i % len(modules)]
        lane = min(range(jobs), key=slots.__getitem__)
        start = slots[lane]
        end = start + rng.choice([0.4, 2.0, 8.0, 30.0, 120.0, 400.0])
        slots[lane] = end
        out = f"build/{module}/obj/comp_units/unit_{i:03d}_kernel.cu.o"
        inputs.setdefault(f"build/{module}/{module}.so", set()).add(out)
        lines.append((end, f"{round(start * 1000)}\t{round(end * 1000)}\t0\t{out}\t{i:016x}"))
    lines = ["# ninja log v7"] + [ln for _, ln in sorted(lines[1:])]  # ninja writes an edge's line when it ends
    t = max(slots)
    for module in modules:
        lines.append(f"{round(t * 1000)}\t{round((t + 3) * 1000)}\t0\tbuild/{module}/{module}.so\t{hash(module) & 0xffff:016x}")
        t += 3
    steps = timeline.steps_of(timeline.last_run("\n".join(lines) + "\n"), str(tmp_path))
    return steps, timeline.critical_path(steps, inputs)


def check_picture(steps, path, title, tmp_path):
    """The picture's geometry, from its SVG as an XML reader sees it: every text inside the width
    (a monospace letter is at most 0.6 of the font size wide; 7 px is counted), every bar's name
    inside its bar, every edge counted once in its module's line; the PNG a PNG of the same size."""
    import struct
    import zlib

    from pp4.report import picture

    root = ET.fromstring(picture.svg(steps, path, title))
    width, height = float(root.get("width")), float(root.get("height"))
    ns = "{http://www.w3.org/2000/svg}"
    rects = [r for r in root.iter(f"{ns}rect") if r.find(f"{ns}title") is not None]
    texts = root.findall(f"{ns}text")
    for t in texts:
        x, n = float(t.get("x")), len(t.text)
        left, right = (x - 7 * n, x) if t.get("text-anchor") == "end" else (x, x + 7 * n)
        assert 0 <= left and right <= width and 0 < float(t.get("y")) <= height, (t.text, left, right, width)
    bars = {r.find(f"{ns}title").text.split(":")[0]: r for r in rects if "/obj/" in r.find(f"{ns}title").text or ".so:" in r.find(f"{ns}title").text}
    named = 0
    for t in texts:
        owner = [r for out, r in bars.items() if out.rsplit("/", 1)[-1].startswith(t.text.rstrip("~"))
                 and abs(float(r.get("y")) + 11 - float(t.get("y"))) < 1e-6
                 and float(r.get("x")) <= float(t.get("x")) <= float(r.get("x")) + float(r.get("width"))]
        if owner:
            named += 1
            r = owner[0]
            assert float(t.get("x")) + 7 * len(t.text) <= float(r.get("x")) + float(r.get("width")), t.text
    per_module = [re.match(r"(\S+): (\d+) edges?(?:, (\d+) too short)?", t.text) for t in texts]
    per_module = [m for m in per_module if m]
    assert sum(int(m.group(2)) for m in per_module) == len(steps)
    assert named + sum(int(m.group(3) or 0) for m in per_module) == len(steps)  # each edge named or counted
    png = tmp_path / "timeline.png"
    png.write_bytes(picture.png(steps, path, title))
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (width, height)
    idat = data[data.index(b"IDAT") + 4:data.index(b"IEND") - 8]
    assert len(zlib.decompress(idat)) == int(height) * (1 + 3 * int(width))
    return named


def test_the_picture_of_400_edges_names_what_fits_and_counts_the_rest_by_module(tmp_path):
    steps, path = synthetic_build(tmp_path, 400, 16)
    title = "last build: 400 edges in 1.2 h; compiled 396 (10.1 h of CPU), restored 0 from the local store " * 2
    named = check_picture(steps, path, title, tmp_path)
    assert 20 <= named < 400, named
