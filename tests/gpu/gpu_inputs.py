"""GPU correctness checks: what they need and why a run skips them (the fixtures of test_gpu_checks.py).

`pytest tests/gpu` on the device machine runs every check whose inputs are there; on a machine
without a CUDA device every test here skips at once, without importing torch (the CPU suite
collects this folder and must not get slower). The inputs, by environment variable:

    PP4_GPU_BUILD        a build folder with the modules built (default: build/ in this checkout):
                         exl3, exl3-facc and p2p for the import check, exl3 and exl3-decode for the
                         decode GEMM's checks
    PP4_GPU_CHECKPOINT   a folder with exl3/ (a checkpoint exllamav3 converted) and
                         reference.safetensors (exllamav3's logits on it): what
                         bench/device/exl3_decode_checks.sh makes with exl3_checkpoint.py and
                         exl3_reference.py here (in /tmp/w/tiny there)

Each check is also a script (`python tests/gpu/exl3_fused_check.py --exl3-build BUILD`), which the
device scripts run to keep its figures as JSON.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def cuda_device_reason() -> str | None:
    """None where a CUDA device is usable, else why not. The cheap test first (no device node, no
    driver: no torch import), then torch's own answer."""
    if not glob.glob("/dev/nvidia[0-9]*") and not os.path.isdir("/proc/driver/nvidia/gpus"):
        return "no CUDA device on this machine (no /dev/nvidia*): run `pytest tests/gpu` on the GPU machine"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device (torch.cuda.is_available() is False)"
    return None


@pytest.fixture(scope="session")
def cuda():
    reason = cuda_device_reason()
    if reason:
        pytest.skip(reason)
    import torch

    return torch.device("cuda")


def build_dir() -> Path:
    return Path(os.environ.get("PP4_GPU_BUILD", REPO / "build"))


@pytest.fixture
def built(cuda):
    """built(*targets): the build folder, or a skip naming the modules that are missing from it."""
    def need(*targets: str) -> Path:
        where = build_dir()
        missing = [t for t in targets if not glob.glob(str(where / t / "*.so"))]
        if missing:
            pytest.skip(f"needs the module(s) {', '.join(missing)} built in {where} (PP4_GPU_BUILD; "
                        f"`ninja {' '.join(missing)}` there)")
        return where
    return need


@pytest.fixture
def checkpoint(cuda) -> Path:
    """The folder with exl3/ and reference.safetensors, or a skip naming them."""
    where = os.environ.get("PP4_GPU_CHECKPOINT")
    if not where or not (Path(where) / "exl3").is_dir() or not (Path(where) / "reference.safetensors").is_file():
        pytest.skip("needs an EXL3 checkpoint and exllamav3's reference logits on it: PP4_GPU_CHECKPOINT=DIR with "
                    "DIR/exl3 and DIR/reference.safetensors (bench/device/exl3_decode_checks.sh makes them)")
    return Path(where)
