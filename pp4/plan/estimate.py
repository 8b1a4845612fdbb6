"""How long a unit takes to compile when no build has timed it: an estimate from its text alone.

ninja starts ready compiles in the order build.ninja lists them, so the longest should come first.
Source size alone misleads: a 200-byte `comp_units/*.cu` that invokes one instantiation macro can
take a minute, a 30 kB C++ file a second. What says more, without running a compiler:

- which of torch's headers the unit reaches (directly or through the project's own headers): the
  whole C++ API (`torch/extension.h`, `torch/script.h`, ...: 35-55 s on the H200 before a line of
  its own), or only ATen's, c10's, pybind11's or Python's (a few seconds);
- whether it is CUDA (a device pass per architecture, then the host pass);
- how much project code its own lines expand to: its text plus, for each macro it invokes that a
  project header defines, that macro's body, expanded the same way (an instantiation macro's
  fan-out);
- how much project code it includes (the bytes of every project file it reaches).

log(seconds) is a linear function of those five, fitted by least squares (one intercept) to 250
units timed on the H200 (16 jobs): exllamav3 1.6.5's 194 (pp4/plan/durations/exl3-1.6.5.tsv),
torch-scatter 2.1.2's 17 and torch-cluster 1.6.3's 39 (`bench/projects.py`). Spearman's rank
correlation with the measured times: 0.61, 0.86 and 0.70 (source size: 0.03, 0.76, 0.61); the sum of
the estimates over the sum of the measured times: 0.84, 0.94 and 0.91. `python
bench/estimate_check.py` prints both for any timed build and refits (`--fit`). It orders the units
no history covers and gives configure's cost line; a measured duration always replaces it. It knows
nothing of the architecture count: a unit built for nine takes several times as long. Out of
sample it can miss by far: causal-conv1d 1.7.0's `causal_conv1d_bwd.cu` (templates instantiated
by plain C++, not macros) is estimated at 21 s and took about 320 s for sm_90 alone.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
_DEFINE = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(?:\([^)\n]*\))?((?:[^\n]*\\\n)*[^\n]*)", re.M)
_CALL = re.compile(rb"\b([A-Za-z_]\w*)[ \t]*\(")
_TORCH_API = ("torch/extension.h", "torch/script.h", "torch/torch.h", "torch/all.h", "torch/python.h")
_HEAVY = ("torch/", "ATen/", "c10/", "pybind11/", "Python.h")
# log(s) = A + B*torch_api + C*(other heavy only) + D*cuda + F*log(1 + expanded kB) + G*log(1 + included kB),
# fitted on the H200 (16 jobs, nvcc 13.0, sm_90).
COEFFICIENTS = (-1.927, 5.025, 3.053, 0.849, 0.147, 0.132)  # A, B, C, D, F, G
_MAX_DEPTH = 8


@functools.lru_cache(maxsize=None)
def estimate_seconds(source: Path, include_dirs: tuple[Path, ...]) -> float:
    """The estimated compile time of one unit on the H200 (other machines scale it). Kept per
    process: configure asks once to order the units and again for its cost line."""
    return math.exp(sum(c * t for c, t in zip(COEFFICIENTS, terms(*features(source, include_dirs)))))


def terms(torch_api: bool, heavy: bool, cuda: bool, expanded_kb: float, included_kb: float) -> list[float]:
    """The terms the coefficients multiply, in their order (bench/estimate_check.py --fit refits them)."""
    return [1.0, float(torch_api), float(heavy and not torch_api), float(cuda), math.log1p(expanded_kb),
            math.log1p(included_kb)]


def features(source: Path, include_dirs: tuple[Path, ...]) -> tuple[bool, bool, bool, float, float]:
    """(reaches torch's whole C++ API, reaches any of torch's, pybind11's or Python's headers, is
    CUDA, expanded kB, included kB): what the estimate reads."""
    files, torch_api, heavy = _closure(source, include_dirs)
    macros = {}
    for f in files:
        for m in _DEFINE.finditer(_read(f)):
            macros[m.group(1)] = m.group(2)
    expanded = _expanded(_read(source), macros, 0, {})
    included = sum(len(_read(f)) for f in files)
    return torch_api, heavy, source.suffix == ".cu", expanded / 1000, included / 1000


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _closure(source: Path, include_dirs: list[Path]) -> tuple[list[Path], bool, bool]:
    """The project files a unit includes, transitively (quoted names from the including file's folder
    first, then the include folders; angle names from the include folders), whether any of them
    names a header of torch's whole C++ API, and whether any names torch's, pybind11's or Python's."""
    seen: dict[Path, None] = {}
    stack, torch_api, heavy = [source], False, False
    while stack:
        path = stack.pop()
        if path in seen:
            continue
        seen[path] = None
        for m in _INCLUDE.finditer(_read(path)):
            name = m.group(2).decode(errors="replace").strip()
            heavy = heavy or name.startswith(_HEAVY)
            torch_api = torch_api or name in _TORCH_API
            if name.startswith(_HEAVY):
                # Counted by name, never walked: a setup.py that lists torch's include folders as
                # its own would otherwise make torch's 14,000 headers the project's code.
                continue
            bases = ([path.parent] if m.group(1) == b'"' else []) + list(include_dirs)
            for base in bases:
                candidate = base / name
                if candidate.is_file():
                    stack.append(candidate)
                    break
    return list(seen), torch_api, heavy


def _expanded(text: bytes, macros: dict[bytes, bytes], depth: int, memo: dict[bytes, int]) -> int:
    """Bytes of text after expanding the project's function-like macros it invokes, recursively."""
    total = len(text)
    if depth >= _MAX_DEPTH:
        return total
    for m in _CALL.finditer(text):
        name = m.group(1)
        if name in macros:
            if name not in memo:
                memo[name] = 0  # a macro that reaches itself adds nothing more
                memo[name] = _expanded(macros[name], macros, depth + 1, memo)
            total += memo[name]
    return total
