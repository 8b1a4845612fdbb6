"""The build folder's configuration has one owner (pp4/build/config.py): a folder written by
another format is refused with what to do by every edge and command that reads it, never read by
raw keys that mean something else now; `python -m pp4.store` beside build.ninja shows the store
that build uses."""

from __future__ import annotations

import json
import subprocess
import sys

from test_specs_build import configured, ninja_bin


def test_a_build_folder_of_another_format_is_refused_with_what_to_do(tmp_path, toolchain):
    _, work = configured(tmp_path)
    config = work / "build" / "pp4.json"
    doc = json.loads(config.read_text())
    assert doc["format"] == 2
    doc.pop("format")  # as every pp4 before the build folder had an owner wrote it
    config.write_text(json.dumps(doc))
    for cmd in ([ninja_bin()], [ninja_bin(), "certify"], [ninja_bin(), "report"]):
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0, said
        assert "written by another version of pp4 (format 1" in said and "python -m pp4.configure" in said, said
        assert "Traceback" not in said, said


def test_the_store_command_shows_the_store_this_build_uses(tmp_path, toolchain):
    _, work = configured(tmp_path)  # configured with --store tmp_path/store
    proc = subprocess.run([sys.executable, "-m", "pp4.store", "stats"], cwd=work, capture_output=True, text=True)
    assert str(tmp_path / "store") in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    elsewhere = subprocess.run([sys.executable, "-m", "pp4.store", "--store", str(tmp_path / "other"), "stats"],
                               cwd=work, capture_output=True, text=True)
    assert str(tmp_path / "other") in elsewhere.stdout + elsewhere.stderr


def test_a_module_s_records_are_typed_documents_of_the_build_folder(tmp_path):
    """Each module's plan (build/<target>/plan.json) and link record (build/.pp4/links/) are read and
    written through pp4/build/modules.py: the bytes every pp4 before wrote, and a plan of another
    format refused with what to do, as pp4.json is."""
    import pytest
    from pp4.build import modules
    from pp4.build.config import BuildFolderError

    plan = {"target": "t", "module": "pp4_t", "root": "/src", "sources": ["/src/a.cpp"], "objects": ["build/t/a.o"],
            "output": "build/t/pp4_t.so", "output_abs": "/w/build/t/pp4_t.so", "cuda_flags": ["-O3"],
            "cxx_flags": [], "link_flags": ["-shared"], "provenance": {"spec": "/src/spec.toml"},
            "toolchain": {"prefix": "/tc", "key": "k", "pinned": True, "files": {"bin/nvcc": "0" * 64}}}
    assert modules.write_plan(tmp_path, modules.PlanRecord(**plan))
    written = (tmp_path / "t" / "plan.json").read_text()
    assert written == json.dumps(plan, indent=1, sort_keys=True) + "\n"  # what configure wrote before
    assert modules.load_plan(tmp_path, "t").toolchain_prefix == "/tc"
    (tmp_path / "t" / "plan.json").write_text(json.dumps({**plan, "format": 2}))
    with pytest.raises(BuildFolderError, match=r"another version of pp4 \(format 2.*python configure.py"):
        modules.load_plan(tmp_path, "t")
    with pytest.raises(BuildFolderError, match="does not exist"):
        modules.load_plan(tmp_path, "u")

    state = tmp_path / ".pp4"
    record = modules.LinkRecord("/w/build/t/pp4_t.so", ("c++", "-shared"), None, [["/w/a.o", "ab" * 32]], None,
                                {"action_key": "k"}, "cd" * 32, [1, 2, 3, 4, 5])
    modules.write_link(state, record)
    path = modules.link_path(state, record.output)
    doc = {"output": record.output, "command": ["c++", "-shared"], "mounts": None,
           "observations": [["/w/a.o", "ab" * 32]], "not_observed": None, "reuse": {"action_key": "k"}}
    assert path.read_text() == json.dumps({**doc, "format": 2, "sha256": "cd" * 32, "identity": [1, 2, 3, 4, 5]},
                                          sort_keys=True)
    assert modules.read_link(state, record.output) == record
    # format 1 (what every pp4 before wrote: no format, no sha256) and a later one: as none, never misread
    for other in (doc, {**json.loads(path.read_text()), "format": 3}):
        path.write_text(json.dumps(other))
        assert modules.read_link(state, record.output) is None


def test_the_last_build_is_the_run_the_marks_say(tmp_path):
    """ninja's log has no mark between runs: the marks the first pp4 edge of each run leaves say
    where each starts. The last run that built something is the last build (a run that only
    reported is not), a mark whose bytes the log no longer has (ninja rewrote it) is not used."""
    import zlib

    from pp4.build.events import RunMark
    from pp4.report import timeline

    head = "# ninja log v7\n"
    first = "0\t900\t0\tbuild/a.o\taa\n950\t1000\t0\tbuild/m.so\tbb\n"
    second = "0\t1200\t0\tbuild/b.o\tcc\n1200\t1300\t0\tbuild/m.so\tdd\n"  # ends later than the first's last
    report = "5\t300\t0\tbuild/.pp4/recheck.stamp\tee\n"
    log = (head + first + second + report).encode()

    def mark(run, text):
        offset = len(text.encode())
        return RunMark(run, offset, zlib.crc32(text.encode()[-256:]))

    marks = [mark("1-1", head), mark("2-2", head + first), mark("3-3", head + first + second)]
    assert [o for _, _, o, _ in timeline.last_run(log.decode())] == ["build/a.o", "build/m.so", "build/b.o", "build/m.so"]
    assert [o for _, _, o, _ in timeline.last_build(log, marks)] == ["build/b.o", "build/m.so"]
    assert [o for _, _, o, _ in timeline.last_build(log, marks, current="2-2")] == ["build/b.o", "build/m.so"]
    assert [o for _, _, o, _ in timeline.last_build(log, marks, current="1-1")] == ["build/a.o", "build/m.so"]
    rewritten = (head + second).encode()  # recompacted: the earlier marks name bytes it no longer has
    assert [o for _, _, o, _ in timeline.last_build(rewritten, marks)] == ["build/b.o", "build/m.so"]
    assert [o for _, _, o, _ in timeline.last_build(log, [])] == ["build/a.o", "build/m.so", "build/b.o", "build/m.so"]
