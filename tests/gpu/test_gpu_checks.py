"""The GPU correctness checks as tests: each skips, saying what it needs, where there is no CUDA
device or its inputs are missing (gpu_inputs.py: not a conftest.py, which would shadow tests/conftest.py
for the modules that import from it). What each checks is the script's own check, run in
this process; the scripts stay runnable alone for the device scripts that keep their figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_inputs import built, checkpoint, cuda  # noqa: F401  (the fixtures)

HERE = Path(__file__).resolve().parent


def run_main(module, argv: list[str], monkeypatch) -> int:
    monkeypatch.setattr(sys, "argv", [module.__file__, *argv])
    return module.main()


def test_exl3_variants_and_p2p_in_one_process(built, monkeypatch):
    """Stock EXL3, facc EXL3 and P2P import together through pp4's loader (pins checked); rms_norm,
    which the facc patch does not touch, agrees bit for bit between the variants."""
    import exl3_gpu_check

    assert run_main(exl3_gpu_check, [str(built("exl3", "exl3-facc", "p2p"))], monkeypatch) == 0


def test_installed_wheels_import_and_run(cuda):
    """The same check on the modules as `ninja wheel` installs them, in a Python without pp4."""
    python = os.environ.get("PP4_GPU_WHEEL_PYTHON")
    if not python:
        pytest.skip("needs PP4_GPU_WHEEL_PYTHON: a Python where the wheels of exl3, exl3-facc and p2p are "
                    "installed and pp4 is not (bench/device/wheels_install_import.sh makes one)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([python, str(HERE / "exl3_gpu_check.py"), "--installed"], cwd="/", env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def decode_modules(built):
    import exl3_decode_check

    from pp4.certify.loader import load_target

    where = built("exl3", "exl3-decode")
    return exl3_decode_check, load_target("exl3", where), load_target("exl3-decode", where)


def test_decode_bit_for_bit_against_upstream(decode_modules, cuda):
    """pp4's reconstruct against upstream's on every bit width 2..8 and all three codebooks."""
    check, up, mine = decode_modules
    out: dict = {}
    check.check_decode(up, mine, cuda, out)
    assert all(r["bit_identical"] for r in out["decode"]), [r for r in out["decode"] if not r["bit_identical"]]


def test_gemm_against_fp64_oracle(decode_modules, cuda):
    """pp4's GEMM against the fp64 oracle at the worker's shapes and row counts: its error no more than
    1e-3 of the largest output (docs/worker.md: 2.1e-4 to 4.4e-4 measured), or twice upstream's."""
    check, up, mine = decode_modules
    out: dict = {}
    check.check_gemm(up, mine, cuda, out)
    bad = [r for r in out["gemm"] if r["err_pp4"] > max(1e-3, 2 * r["err_upstream"])]
    assert not bad, bad


def test_checkpoint_linears_against_upstream(decode_modules, checkpoint, cuda):
    """On a checkpoint exllamav3 converted: pp4's decode of its linears bit for bit upstream's."""
    check, _, mine = decode_modules
    out: dict = {}
    check.check_reference(mine, str(checkpoint / "reference.safetensors"), cuda, out)
    same = [r for r in out["checkpoint"]["results"] if "reconstruct_bit_identical" in r]
    assert same and all(r["reconstruct_bit_identical"] for r in same), out["checkpoint"]["results"]


def test_fused_steps_against_steps_apart(built, monkeypatch):
    """norm_transform, gemm_transformed and gemm_swiglu against the steps run apart and fp64 oracles."""
    import exl3_fused_check

    assert run_main(exl3_fused_check, ["--exl3-build", str(built("exl3-decode"))], monkeypatch) == 0


def test_worker_exl3_backends_against_exllamav3_forward(built, checkpoint, monkeypatch):
    """Both EXL3 backends of the worker against exllamav3's logits on the checkpoint, whole and stepped."""
    import exl3_worker_exactness

    where = built("exl3", "exl3-decode")
    argv = ["--checkpoint", str(checkpoint / "exl3"), "--reference", str(checkpoint / "reference.safetensors"),
            "--exl3-build", str(where)]
    assert run_main(exl3_worker_exactness, argv, monkeypatch) == 0
