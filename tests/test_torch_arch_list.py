"""TORCH_CUDA_ARCH_LIST read as torch's BuildExtension reads it, when --arch is not given: the
-gencode flags are the ones torch's own _get_cuda_arch_flags makes of the same value (the oracle),
configure names where its architectures came from, and its error without either names the variable."""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import REPO
from test_build import run

from pp4.toolchain import archs

FIXTURE = REPO / "tests" / "fixtures" / "ptx"

VALUES = ["9.0", "Hopper", "8.0;9.0+PTX", "8.0 8.6", "Ampere;Hopper", "Ampere+Tegra", "Blackwell", "7.5 8.0+PTX",
          "9.0a", "Volta+Tegra;Turing", "Maxwell+Tegra Pascal", "Kepler+Tesla", "10.0a+PTX;Ada"]


def torch_flags(value: str, monkeypatch) -> list[str]:
    from torch.utils.cpp_extension import _get_cuda_arch_flags

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", value)
    return _get_cuda_arch_flags([])


@pytest.mark.parametrize("value", VALUES)
def test_the_flags_are_the_ones_torch_makes_of_the_same_value(value, monkeypatch):
    mine = archs.gencode_flags(archs.from_torch_env(value))
    # torch sorts its flags; pp4 keeps the order the list gives (the set is what nvcc compiles)
    assert sorted(mine) == torch_flags(value, monkeypatch)
    assert len(set(mine)) == len(mine)


@pytest.mark.parametrize("value", ["9.0;", "Hopper+PTX", "sm_90", "9", "9.0+ptx", "Hopper,Ampere"])
def test_what_torch_refuses_is_refused(value, monkeypatch):
    with pytest.raises(ValueError):
        torch_flags(value, monkeypatch)
    with pytest.raises(archs.ArchError, match="TORCH_CUDA_ARCH_LIST"):
        archs.from_torch_env(value)


@pytest.mark.parametrize("value", [None, "", "native"])
def test_unset_empty_or_native_means_the_visible_gpus(value):
    assert archs.from_torch_env(value) == []


def configure(tmp_path, value, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": os.environ["PATH"]}
    env.pop("TORCH_CUDA_ARCH_LIST", None)
    if value is not None:
        env["TORCH_CUDA_ARCH_LIST"] = value
    return run([sys.executable, str(REPO / "configure.py"), "--ext-spec", str(FIXTURE / "ext.toml"), "--no-reuse",
                *args], tmp_path, env, check=False)


def test_configure_takes_the_variable_names_it_and_records_it(tmp_path, toolchain):
    proc = configure(tmp_path, "Hopper")
    assert proc.returncode == 0, proc.stderr
    assert "configure: arch 9.0+PTX (from TORCH_CUDA_ARCH_LIST)" in proc.stdout
    ninja = (tmp_path / "build.ninja").read_text().replace("$\n", "")
    assert "-gencode=arch=compute_90,code=sm_90     -gencode=arch=compute_90,code=compute_90" in ninja
    # recorded with the folded environment, where a change after configure is compared
    assert json.loads((tmp_path / "build" / "pp4.json").read_text())["compile"]["folded"]["TORCH_CUDA_ARCH_LIST"] \
        == "Hopper"
    # --arch wins over the variable, as a flag naming an arch wins in BuildExtension
    proc = configure(tmp_path, "Hopper", "--arch", "8.0")
    assert proc.returncode == 0, proc.stderr
    assert "configure: arch 8.0 (from --arch)" in proc.stdout
    assert "compute_90" not in (tmp_path / "build.ninja").read_text()


@pytest.mark.skipif(bool(__import__("shutil").which("nvidia-smi")), reason="a GPU may be visible here")
def test_without_arch_variable_or_gpu_the_error_names_both_ways(tmp_path, toolchain):
    proc = configure(tmp_path, None)
    assert proc.returncode != 0
    assert "--arch" in proc.stderr and "TORCH_CUDA_ARCH_LIST is unset" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    proc = configure(tmp_path, "9.0;")
    assert proc.returncode != 0 and "TORCH_CUDA_ARCH_LIST='9.0;'" in proc.stderr, proc.stderr
