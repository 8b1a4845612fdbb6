"""Two variants of one tree (the same sources, two module names) share a unit's object only where
the compilers prove the name cannot reach it (pp4/reuse/variants.py). Judged against a real
`--no-reuse` compile of the second variant in another folder: every object the second variant
reused is byte for byte that compile's; where the name does reach the object (a two-level
stringizing, -g3), the variant compiles, and its object indeed differs from the first's."""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import pytest

from conftest import REPO, RedisServer
from pp4.build.events import Events
from test_specs_build import ninja_bin, run

FIXTURE = REPO / "tests" / "fixtures" / "variants"
UNITS = ("bindings.cpp", "plain.cpp", "pasted.cpp", "expanded.cpp", "kernel.cu")


def configured(tmp_path: Path, name: str, *flags: str) -> Path:
    project = tmp_path / name / "project"
    shutil.copytree(FIXTURE, project)
    work = tmp_path / name / "work"
    work.mkdir()
    run([sys.executable, str(REPO / "configure.py"), "--arch", "9.0", "--ext-spec", str(project / "spec.toml"),
         *flags], work)
    return work


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def events_of(work: Path, target: str) -> dict[str, dict]:
    """Each unit's newest event (its edge's own, or the prepass's)."""
    made = Events(str(work / "build" / ".pp4"))
    return {u: e.to_json() for u in UNITS if (e := made.get(f"build/{target}/obj/src/{u}.o")) is not None}


def test_variants_share_a_unit_only_where_its_preprocessing_never_reads_the_name(tmp_path, toolchain):
    work = configured(tmp_path, "shared", "--store", str(tmp_path / "store"))
    run([ninja_bin(), "variant-a", "variant-c"], work)
    run([ninja_bin(), "variant-b", "variant-d"], work)
    b = events_of(work, "variant-b")
    assert sorted(b) == sorted(UNITS)
    shared = {u for u, e in b.items() if e["status"] == "reused"}
    # `##` pastes the macro's name, never its value: shared, where a text scan would refuse it.
    assert shared == {"plain.cpp", "pasted.cpp", "kernel.cu"}, {u: (e["status"], e.get("not_shared")) for u, e in b.items()}
    for unit in shared:
        assert "another variant" in b[unit]["via"] and "/build/variant-a/obj/" in b[unit]["reused_from"]["output"]
    assert b["expanded.cpp"]["not_shared"] == "its preprocessing reads TORCH_EXTENSION_NAME"
    # pybind11's headers test PYBIND11_STDLIB (the internals tag EXL3's facc variant sets) too.
    assert b["bindings.cpp"]["not_shared"] == "its preprocessing reads PYBIND11_STDLIB, TORCH_EXTENSION_NAME"
    d = events_of(work, "variant-d")["plain.cpp"]
    assert d["status"] == "compiled" and "-g3" in d["not_shared"]

    run([ninja_bin(), "certify"], work)  # every shared object's observations re-checked, nothing compiled

    # The oracle: variant b compiled in another folder with reuse off.
    alone = configured(tmp_path, "alone", "--no-reuse")
    run([ninja_bin(), "variant-b", "variant-c", "variant-d"], alone)
    for unit in UNITS:
        rel = Path("build/variant-b/obj/src") / f"{unit}.o"
        assert sha(work / rel) == sha(alone / rel), f"{unit}: the shared object is not what a compile gives"
    # Where the proof refuses, the name does reach the object.
    for unit in ("expanded.cpp", "bindings.cpp"):
        assert sha(work / "build/variant-a/obj/src" / f"{unit}.o") != sha(alone / "build/variant-b/obj/src" / f"{unit}.o")
    assert sha(alone / "build/variant-c/obj/src/plain.cpp.o") != sha(alone / "build/variant-d/obj/src/plain.cpp.o")

    # Kept as variant b's own: after its objects go, all five are found under b's own commands.
    shutil.rmtree(work / "build" / "variant-b")
    run([ninja_bin(), "variant-b"], work)
    b = events_of(work, "variant-b")
    assert len(b) == 5 and all(e["status"] == "reused" and "another variant" not in e["via"] for e in b.values()), b


def test_the_name_free_command_leaves_out_only_the_name_macros_and_the_outputs():
    from pp4.reuse.variants import consulted, name_free

    macros = ("TORCH_EXTENSION_NAME", "PYBIND11_STDLIB")
    a = ["nvcc", "-DTORCH_EXTENSION_NAME=a", "-DTORCH_EXTENSION_NAME_X=1", "-c", "u.cu", "-o", "a/u.o", "-MF", "a/u.o.d"]
    b = ["nvcc", "-DTORCH_EXTENSION_NAME=b", '-DPYBIND11_STDLIB="_t"', "-DTORCH_EXTENSION_NAME_X=1", "-c", "u.cu",
         "-o", "b/u.o", "-MF", "b/u.o.d"]
    assert name_free(a, macros) == name_free(b, macros)
    assert "-DTORCH_EXTENSION_NAME_X=1" in name_free(a, macros)  # a macro that merely starts with the name stays
    assert name_free(["g++", "-c", "u.cpp", "-o", "u.o"], macros) is None
    text = b"#define TORCH_EXTENSION_NAME_X 1\n#undef PYBIND11_STDLIB\nint x;\n# define TORCH_EXTENSION_NAME a\n"
    assert consulted(text, macros) == ["PYBIND11_STDLIB"]


@pytest.mark.slow
def test_a_variant_in_another_checkout_shares_through_the_remote_store(tmp_path, toolchain):
    """Variant a built in one checkout with its own local store, sent to Redis; variant b in another
    checkout with an empty local store finds a's compiles under the name-free key in the remote
    tier, proves them, and restores them: each the object a --no-reuse compile of b gives."""
    pytest.importorskip("redis", reason="the Redis client (pip install 'pp4[redis]')")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path / "redis")
    try:
        one = configured(tmp_path, "one", "--store", str(tmp_path / "store-one"), "--remote-store", server.url())
        run([ninja_bin(), "variant-a"], one)
        two = configured(tmp_path, "two", "--store", str(tmp_path / "store-two"), "--remote-store", server.url())
        run([ninja_bin(), "variant-b"], two)
    finally:
        server.stop()
    b = events_of(two, "variant-b")
    shared = {u for u, e in b.items() if e["status"] == "reused"}
    assert shared == {"plain.cpp", "pasted.cpp", "kernel.cu"}, {u: (e["status"], e.get("not_shared")) for u, e in b.items()}
    assert all(b[u]["tier"] == "remote" and "another variant" in b[u]["via"] for u in shared)
    alone = configured(tmp_path, "alone", "--no-reuse")
    run([ninja_bin(), "variant-b"], alone)
    for unit in shared:
        rel = Path("build/variant-b/obj/src") / f"{unit}.o"
        assert sha(two / rel) == sha(alone / rel), f"{unit}: the shared object is not what a compile gives"
