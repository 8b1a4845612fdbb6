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
- how much project code it includes (the bytes of every project file it reaches);
- how many `__global__` template instantiations it asks for, past 16: `kernel<...>` written out,
  through a class or function template that lists them, or through macros, one passed to another
  by name included (exllamav2's `unit_exl2_1b.cu` is 13 lines that name four instances of a class
  template listing 22 kernels each: 88).

log(seconds) is a linear function of those six, fitted by least squares to 250 units timed on the
H200 (16 jobs) with an intercept per project (a project's flags scale all its units alike), the
intercept here being their mean: exllamav3 1.6.5's 194 (pp4/plan/durations/exl3-1.6.5.tsv),
torch-scatter 2.1.2's 17 and torch-cluster 1.6.3's 39 (`bench/build/projects.py`). `python
bench/build/estimate_ranking.py` prints each set's rank correlation with measured times and scale for any
timed build, and refits (`--fit`); docs/specs.md has the figures. It orders the units no history
covers and gives configure's cost line (scaled to this machine once some of its units are timed
here); a measured duration always replaces it. It knows nothing of the architecture count: a unit
built for nine takes several times as long.

This machine's speed: the progress reporter (pp4/report/progress.py) adds each compile of a build
to a record kept per user and machine, $PP4_CACHE_DIR/machine-speed.json (~/.cache/pp4/ by
default; $PP4_SPEED_FILE names another file), under the host's name and CPU model: the compile's
CPU seconds against the H200 figure configure had for it, for the units whose figure is at least
SPEED_MIN_H200_S (in a unit that small, starting the compiler is most of its time, which says
little of a large one's). Once it holds SPEED_MIN_UNITS, configure scales the H200 figures by
their ratio of sums (the larger units weigh more, as they do in a build's time) in every build
folder, a new one included, where the build's own log does not give a scale. Removing the file
resets it; only the last SPEED_KEEP compiles count, so it follows a machine that changed.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import re
from pathlib import Path
from typing import NamedTuple

SPEED_ENV = "PP4_SPEED_FILE"
SPEED_MIN_H200_S = 1.0
SPEED_MIN_UNITS = 3
SPEED_KEEP = 200

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)
_DEFINE = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(?:\(([^)\n]*)\))?((?:[^\n]*\\\n)*[^\n]*)", re.M)
_CALL = re.compile(rb"\b([A-Za-z_]\w*)[ \t]*\(")
_TORCH_API = ("torch/extension.h", "torch/script.h", "torch/torch.h", "torch/all.h", "torch/python.h")
_HEAVY = ("torch/", "ATen/", "c10/", "pybind11/", "Python.h")
# log(s) = A + B*torch_api + C*(other heavy only) + D*cuda + F*log(1 + expanded kB) + G*log(1 + included kB)
#          + H*log(max(kernels, 16) / 16), fitted on the H200 (16 jobs, nvcc 13.0, sm_90).
COEFFICIENTS = (-1.421, 4.324, 2.916, 0.692, 0.132, 0.187, 0.615)  # A, B, C, D, F, G, H
_MAX_DEPTH = 8
_KERNELS_FREE = 16  # instantiations a unit makes before they count


@functools.lru_cache(maxsize=None)
def estimate_seconds(source: Path, include_dirs: tuple[Path, ...]) -> float:
    """The estimated compile time of one unit on the H200 (other machines scale it). Kept per
    process: configure asks once to order the units and again for its cost line."""
    return math.exp(sum(c * t for c, t in zip(COEFFICIENTS, terms(*features(source, include_dirs)))))


def terms(torch_api: bool, heavy: bool, cuda: bool, expanded_kb: float, included_kb: float,
          kernels: int) -> list[float]:
    """The terms the coefficients multiply, in their order (bench/build/estimate_ranking.py --fit refits them).
    Kernel instantiations count only past a threshold: most units make a few, which the other
    terms already price; a unit that makes dozens compiles each of them for the device."""
    return [1.0, float(torch_api), float(heavy and not torch_api), float(cuda), math.log1p(expanded_kb),
            math.log1p(included_kb), math.log(max(kernels, _KERNELS_FREE) / _KERNELS_FREE)]


def features(source: Path, include_dirs: tuple[Path, ...]) -> tuple[bool, bool, bool, float, float, int]:
    """(reaches torch's whole C++ API, reaches any of torch's, pybind11's or Python's headers, is
    CUDA, expanded kB, included kB, kernel instantiations): what the estimate reads."""
    files, torch_api, heavy = _closure(source, include_dirs)
    macros, params, templates, included = {}, {}, {}, 0
    for f in files:
        text = _read(f)
        included += len(text)
        for m in _DEFINE.finditer(text):
            macros[m.group(1)] = m.group(3)
            params[m.group(1)] = [p.strip() for p in m.group(2).split(b",")] if m.group(2) else []
        templates.update(_templates(text))
    own = _read(source)
    expanded = _expanded(own, macros, 0, {})
    kernels = _instantiations(own, _Definitions(macros, params, templates), 0, {}, {})
    return torch_api, heavy, source.suffix == ".cu", expanded / 1000, included / 1000, kernels


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


_TEMPLATE = re.compile(rb"\btemplate\s*<")
_ATTRIBUTE = re.compile(rb"\b(?:__launch_bounds__|__attribute__|__declspec|alignas|decltype)\s*\(")
_NAMED = re.compile(rb"\b(?:struct|class)\s+([A-Za-z_]\w*)")
_CALLED = re.compile(rb"([A-Za-z_]\w*)\s*\(")


def _closing(text: bytes, start: int, open_: int, close: int) -> int:
    """The index just past the bracket that closes the one at `start` (len(text) if none)."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _templates(text: bytes) -> dict[bytes, tuple[bool, bytes]]:
    """The templates a file defines, by name: (a __global__ kernel, its body). Class templates and
    function templates both: what they instantiate when they are instantiated is their body's."""
    found = {}
    for m in _TEMPLATE.finditer(text):
        after_params = _closing(text, m.end() - 1, ord("<"), ord(">"))
        brace, semi = text.find(b"{", after_params), text.find(b";", after_params)
        if brace < 0 or 0 <= semi < brace:
            continue  # a declaration, an alias or a template variable: no body
        head = text[after_params:brace]
        named = _NAMED.search(head)
        if named and b"(" not in head[:named.start()]:
            name = named.group(1)
        else:
            for a in reversed(list(_ATTRIBUTE.finditer(head))):
                head = head[:a.start()] + head[_closing(head, a.end() - 1, ord("("), ord(")")):]
            called = _CALLED.search(head)
            if called is None:
                continue
            name = called.group(1)
        body = text[brace:_closing(text, brace, ord("{"), ord("}"))]
        found[name] = (b"__global__" in text[after_params:brace], body)
    return found


class _Definitions(NamedTuple):
    macros: dict[bytes, bytes]  # function-like or not: name -> body
    params: dict[bytes, list[bytes]]  # a function-like macro's parameter names
    templates: dict[bytes, tuple[bool, bytes]]  # name -> (a __global__ kernel, body)


def _instantiations(text: bytes, defs: _Definitions, depth: int, memo: dict, aliases: dict[bytes, bytes]) -> int:
    """How many __global__ template instantiations text asks for: each `kernel<...>` one, each use
    of another template or of a project macro what its body asks for (an instantiation macro's
    fan-out, a class template that lists kernels). A macro passed to a macro by name counts at each
    call the receiving body makes of it (`FOREACH_SHAPE(INST, ...)`); `aliases` maps the receiving
    macro's parameters to what was passed. Repeats of one instantiation count again."""
    if depth >= _MAX_DEPTH:
        return 0
    total = 0
    for m in _USE.finditer(text):
        name = aliases.get(m.group(1), m.group(1))
        passed: dict[bytes, bytes] = {}
        if name in defs.templates:
            kernel, body = defs.templates[name]
            if kernel:
                total += m.group(2) == b"<"
                continue
        elif name in defs.macros and m.group(2) == b"(":
            body = defs.macros[name]
            for param, arg in zip(defs.params[name], _arguments(text, m.end() - 1)):
                arg = aliases.get(arg, arg)
                if arg in defs.macros or arg in defs.templates:
                    passed[param] = arg
        else:
            continue
        key = (name, tuple(sorted(passed.items())))
        if key not in memo:
            memo[key] = 0  # a template or macro that reaches itself adds nothing more
            memo[key] = _instantiations(body, defs, depth + 1, memo, passed)
        total += memo[key]
    return total


def _arguments(text: bytes, open_paren: int) -> list[bytes]:
    """The comma-separated arguments of the call whose parenthesis is at open_paren, stripped."""
    args, depth, begin = [], 0, open_paren + 1
    for i in range(open_paren, len(text)):
        c = text[i]
        if c in b"([{":
            depth += 1
        elif c in b")]}":
            depth -= 1
            if depth == 0:
                args.append(text[begin:i].strip())
                break
        elif c == ord(",") and depth == 1:
            args.append(text[begin:i].strip())
            begin = i + 1
    return args


_USE = re.compile(rb"\b([A-Za-z_]\w*)\s*(<(?!<)|\()")


def speed_file() -> Path:
    from pp4 import paths

    return Path(os.environ.get(SPEED_ENV) or paths.cache_dir() / "machine-speed.json")


def _machine() -> str:
    """The record's key: the host and its CPU model (a cache folder may be shared by machines)."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return f"{platform.node()} / {model or platform.machine()} / {os.cpu_count()} CPUs"


def _read_speed() -> dict:
    try:
        doc = json.loads(speed_file().read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def learn_speed(pairs: list[tuple[float, float]]) -> None:
    """Add (CPU seconds here, H200 seconds) of compiles to this machine's record."""
    from pp4.files import write_if_changed

    pairs = [(round(c, 2), round(h, 2)) for c, h in pairs if h >= SPEED_MIN_H200_S and c > 0]
    if not pairs:
        return
    doc = _read_speed()
    kept = doc.get(_machine(), [])
    doc[_machine()] = ([p for p in kept if isinstance(p, list) and len(p) == 2] + [list(p) for p in pairs])[-SPEED_KEEP:]
    try:
        write_if_changed(speed_file(), json.dumps(doc, indent=0, sort_keys=True) + "\n")
    except OSError:
        pass  # a cache that cannot be written only keeps the H200's figures


def machine_speed() -> tuple[float, int]:
    """This machine's CPU seconds per H200 second from its record, and how many compiles it rests
    on; (1.0, n) with fewer than SPEED_MIN_UNITS."""
    pairs = [p for p in _read_speed().get(_machine(), []) if isinstance(p, list) and len(p) == 2 and p[1] > 0]
    if len(pairs) < SPEED_MIN_UNITS:
        return 1.0, len(pairs)
    return sum(c for c, _ in pairs) / sum(h for _, h in pairs), len(pairs)
