"""The prepass's batched events (pp4/build/events.py), on real files and a real store, without a compiler:
objects are random bytes stored through the Reuser exactly as a compile stores them."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, compile_section, store_as_compiled
from pp4.build import config as buildconfig

from pp4.certify import certificate
from pp4.build import events
from pp4.reuse import inputsets, prepass
from pp4.store import hashed
from pp4.reuse import wrapper as reuse
from pp4.reuse.actionkey import parse_compile


class Scene:
    """Three units with shared headers, stored; the build's objects then removed."""

    def __init__(self, base: Path, toolchain, units: int = 3):
        self.src = base / "src"
        (self.src / "include").mkdir(parents=True)
        shared = base / "sys"
        shared.mkdir()
        headers = []
        for j in range(6):
            h = shared / f"s{j}.h"
            h.write_text(f"#define S{j}\n")
            headers.append(str(h))
        build = base / "build"
        self.state = build / ".pp4"
        config = {"limits": {"address_space": None, "cpus": None, "nice": 0, "nvcc_threads": 1,
                             "tmpdir": str(build / "tmp")},
                  "reuse": {"roots": [str(self.src)],
                            "state_dir": str(self.state), "store": str(base / "store"),
                            "toolchain": {"bin/nvcc": "0" * 64}},
                  "compile": compile_section(toolchain)}
        env = config["compile"]["env"]["cuda"]
        build.mkdir()
        buildconfig.write(build, **config)
        self.config = build / "pp4.json"
        self.cfg = buildconfig.ReuseConfig.load(self.config)
        old = time.time() - 3600
        for h in headers:
            os.utime(h, (old, old))
        r = reuse.Reuser(self.cfg)
        rnd = random.Random(1)
        self.actions = []
        for i in range(units):
            unit = self.src / f"unit{i}.cu"
            unit.write_text(f"// unit {i}\n")
            os.utime(unit, (old, old))
            out, dep = build / "obj" / f"unit{i}.cu.o", build / "obj" / f"unit{i}.cu.o.d"
            out.parent.mkdir(exist_ok=True)
            argv = ["nvcc", "-c", str(unit), "-o", str(out), "-MD", "-MF", str(dep), "-isystem", str(shared)]
            stored = store_as_compiled(r, argv, env, [str(unit)] + headers, rnd.randbytes(4096))
            assert stored["action_key"], stored
            self.actions.append({"argv": argv, "output": str(out), "target": "t", "source": str(unit), "env": env})
        self.actions_file = build / "actions.json"
        self.actions_file.write_text(json.dumps({"actions": self.actions}))
        self.stamp = self.state / "prepass.stamp"

    def outputs(self) -> list[str]:
        return [a["output"] for a in self.actions]

    def remove_objects(self) -> None:
        for o in self.outputs():
            Path(o).unlink(missing_ok=True)

    def prepass(self) -> dict:
        prepass.prepass(self.cfg, self.actions_file, self.stamp)
        return json.loads(self.stamp.read_text())


def test_prepass_writes_one_batch_that_supersedes_the_event_files(tmp_path, toolchain):
    s = Scene(tmp_path, toolchain)
    for o in s.outputs():
        assert events.event_path(str(s.state), o).exists()  # the compiles' own events
    s.remove_objects()
    assert s.prepass()["restored"] == 3
    batch = events.read_batch(str(s.state))
    assert sorted(batch) == sorted(s.outputs())
    known = events.Events(str(s.state))
    for o in s.outputs():
        assert not events.event_path(str(s.state), o).exists(), "a restore removes the older event file"
        assert known.get(o).status == "reused" and known.get(o).via == "prepass"
    # A compile edge's event written after the batch is the newer one, and wins.
    r = reuse.Reuser(s.cfg)
    action = r.action(parse_compile(s.actions[0]["argv"]), s.actions[0]["env"])
    r.event(action, status="compiled", object_sha256="0" * 64, command=action.command, env=action.env, mounts=None,
            compile_duration_s=2.0)
    assert events.Events(str(s.state)).get(s.outputs()[0]).status == "compiled"
    # A later prepass restoring only one object keeps the others' entries.
    Path(s.outputs()[1]).unlink()
    for o in s.outputs():
        Path(o + reuse.MARKER_SUFFIX).unlink(missing_ok=True)
    assert s.prepass()["restored"] == 1
    known = events.Events(str(s.state))
    assert known.get(s.outputs()[0]).status == "compiled"
    assert known.get(s.outputs()[1]).status == "reused" and known.get(s.outputs()[2]).status == "reused"


def test_prepass_killed_before_its_batch_restores_again(tmp_path, toolchain):
    """The state a kill leaves between the markers and the batch: objects and markers, no events.
    The next prepass must start those objects over, and then every one has its event."""
    s = Scene(tmp_path, toolchain)
    s.remove_objects()
    s.prepass()
    events.batch_path(str(s.state)).unlink()
    assert all(events.Events(str(s.state)).get(o) is None for o in s.outputs())
    assert all(Path(o + reuse.MARKER_SUFFIX).exists() for o in s.outputs())
    assert s.prepass()["restored"] == 3
    known = events.Events(str(s.state))
    assert all(known.get(o).status == "reused" for o in s.outputs())


def test_stale_event_file_left_by_a_kill_is_caught_by_the_certificate_check(tmp_path, toolchain):
    """Killed after the batch but before the older event files are removed: the older event wins,
    and it names another object's sha256, which the certificate's own recheck refuses."""
    s = Scene(tmp_path, toolchain)
    out = s.outputs()[0]
    stale = json.loads(events.event_path(str(s.state), out).read_text())
    s.remove_objects()
    s.prepass()
    stale["object_sha256"] = "0" * 64  # the object the older event described, not this one
    events.write(str(s.state), events.CompileEvent.from_json(stale))
    with pytest.raises(certificate.CertificateError, match="differs from the one recorded"):
        certificate.write(s.config, s.actions_file, s.state.parent / "certificate.json.gz")


WRITER = """
import sys
from pp4.build import events
from pp4.reuse import inputsets, prepass
from pp4.store import hashed
state = sys.argv[1]
gen = 0
while True:
    gen += 1
    events.write_batch(state, [events.CompileEvent(output=f"/o/{i}", source="/s", root=None, status="compiled",
                                                   object_sha256=str(gen), command=[], env={"pad": "x" * 200},
                                                   mounts=None) for i in range(2000)])
"""


def test_batch_killed_mid_write_is_old_or_new_never_torn(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for delay in (0.15, 0.31, 0.47, 0.6):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(state)], env=env)
        deadline = time.monotonic() + 30
        while not events.batch_path(str(state)).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        batch = events.read_batch(str(state))
        assert len(batch) == 2000, "a kill must leave the previous batch or the new one, whole"
        assert len({e["object_sha256"] for e in batch.values()}) == 1


def test_the_prepass_keeps_the_build_state_bounded(tmp_path, toolchain):
    """Events of outputs the build no longer has (file and batch entry) and sets no event names go;
    what the configured outputs' events name stays, and a set younger than the grace stays."""
    s = Scene(tmp_path, toolchain)
    s.remove_objects()
    s.prepass()
    gone = str(tmp_path / "build" / "obj" / "removed.cu.o")
    events.write(str(s.state), events.CompileEvent(output=gone, source="/s/removed.cu", root=None, status="compiled",
                                                   object_sha256="0" * 64, command=[], env={}, mounts=None))
    batch = events.read_batch(str(s.state))
    batch[gone] = dict(next(iter(batch.values())), output=gone)
    events.batch_path(str(s.state)).write_text(json.dumps({"events": batch}))
    sets = inputsets.directory(s.state)
    old_set, young_set = (pack_write(sets, json.dumps([[f"/x/{n}.h", None]], separators=(",", ":")).encode())
                          for n in ("old", "young"))
    hour_ago = time.time() - 2 * prepass.STATE_SETS_GRACE_S
    os.utime(hashed.path_of(sets, old_set), (hour_ago, hour_ago))
    named = {events.Events(str(s.state)).get(o).sets_pack for o in s.outputs()}
    assert None not in named
    for name in named:  # as old as the stale one: kept because events name them
        os.utime(hashed.path_of(sets, name), (hour_ago, hour_ago))

    Path(s.outputs()[0]).unlink()
    Path(s.outputs()[0] + reuse.MARKER_SUFFIX).unlink(missing_ok=True)
    s.prepass()

    assert not events.event_path(str(s.state), gone).exists()
    assert gone not in events.read_batch(str(s.state))
    assert all(events.Events(str(s.state)).get(o) is not None for o in s.outputs())
    assert hashed.read(sets, old_set) is None
    assert hashed.read(sets, young_set) is not None
    assert all(hashed.read(sets, name) is not None for name in named)


def pack_write(folder: Path, data: bytes) -> str:
    """A pack of one set, kept in folder; its name."""
    import hashlib

    pack = inputsets.pack({hashlib.sha256(data).hexdigest(): data})
    inputsets.write_pack(folder, pack)
    return pack.name
