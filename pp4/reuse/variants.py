"""One object for two variants of a module, where the compilers prove it is the same object.

Two variants of one source tree (EXL3's stock and facc, two modules of one spec built from the same
root) compile many units whose commands differ only in the macros that carry the module's name:
`-DTORCH_EXTENSION_NAME=...` and pybind11's internals tag (configure lists them: `name_macros`). Those
values are keyed as written (a macro can carry a name anywhere: token pasting, a header that
stringizes it, a `#if` on it), so each variant's command is its own. This module finds where the
value cannot matter, by asking the compilers:

- A `-D` reaches only the preprocessor, unless a flag puts macro definitions or the command line
  into the output (`-g3`, `-dD`, `-frecord-gcc-switches`, LTO's option records, ...): a command with
  such a flag proves nothing. For nvcc, `nvcc --dryrun` of the very command shows where each `-D`
  goes: every command it reaches must be a host-compiler preprocessing (`-E`); nvcc 13.0 passes them
  to its host and device preprocessing passes and to nothing else.
- Each of those preprocessings is run again with gcc's `-dU`, which prints a `#define` (or `#undef`)
  line for every macro whose value or definedness the preprocessing consulted: expanded, tested by
  `#ifdef`/`defined`, however it is spelled. When no name macro is among them, the preprocessor
  took the same steps as it would under any other value, or none: the same text went on.

So a compile whose every preprocessing leaves the name macros unread gives, from the same inputs,
the object another variant's compile gave (the same command without those macros: its
`name_free_key`). The inputs are the stored entry's observations, checked as for any lookup; the
other compile ran at the same fixed paths (pp4/execution/root.py), so its files were this
compile's. The proof costs a dry run and one preprocessing per pass (seconds), against a compile
(tens of seconds to minutes): it runs only where a stored entry of another variant holds.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import tempfile
from pathlib import Path

from pp4.files import canonical_json

NAME_FREE_FORMAT = 1

# Flags under which a -D value can reach the object other than through the preprocessed text:
# macro definitions in the debug information or in the preprocessed output (-g3, -d letters), the
# command line recorded (-frecord-gcc-switches, LTO's option sections), options handed to the
# preprocessor unseen (-Wp, -Xpreprocessor); and flags under which the object's own name does
# (a split DWARF file's name, coverage data files named after the object, dumps and saved temporaries).
_UNPROVABLE_FLAG = re.compile(r"^(-g[a-z]*3$|-d[A-Z]+$|-fdebug-macro|-frecord-gcc-switches|-flto|-Wp,|-Xpreprocessor"
                              r"|-fdirectives-only|-gsplit-dwarf|-fprofile-|--coverage|-ftest-coverage|-save-temps"
                              r"|-aux-info|-fdump-|-dumpbase|-dumpdir|-auxbase)")
_DEPFILE_FLAGS = {"-M", "-MM", "-MD", "-MMD", "-MP", "-MG"}
_DEPFILE_FLAGS_WITH_VALUE = {"-MF", "-MT", "-MQ"}
_HOST_COMPILERS = re.compile(r"(^|-)(gcc|g\+\+|cc|c\+\+|clang|clang\+\+)(-[\d.]+)?$")


def _defines(word: str, macros: tuple[str, ...]) -> bool:
    """Whether a word of a command defines one of the name macros (as pp4 writes them: one word)."""
    return word.startswith("-D") and word[2:].partition("=")[0] in macros


def name_free(command, macros: tuple[str, ...]) -> tuple[str, ...] | None:
    """The command without its name macros' definitions and with its object and dependency file
    unnamed (each variant writes its own); None when it defines no name macro."""
    kept = [w for w in command if not _defines(w, macros)]
    if len(kept) == len(command):
        return None
    for i, w in enumerate(kept[:-1]):
        if w in ("-o", "-MF"):
            kept[i + 1] = "<output>" if w == "-o" else "<depfile>"
    return tuple(kept)


def name_free_key(command, env: dict[str, str], in_root: bool, macros: tuple[str, ...]) -> str | None:
    """The key two variants' compiles of one unit share (None: the command names no module)."""
    kept = name_free(command, macros)
    if kept is None:
        return None
    doc = {"name_free_format": NAME_FREE_FORMAT, "argv": list(kept), "env": env, "root": in_root,
           "macros": sorted(macros)}
    return hashlib.sha256(canonical_json(doc)).hexdigest()


def unprovable_flags(argv) -> list[str]:
    return [w for w in argv if _UNPROVABLE_FLAG.match(w)]


def _flag_problem(flag: str) -> str:
    return f"under {flag} a macro's value or the object's name can reach the object"


def preprocessing_of_compile(argv: list[str]) -> list[str]:
    """A gcc/g++ compile as the preprocessing it starts with, printing the macros it consults
    (-dU) with its text on stdout: -c becomes -E, no object, no dependency file."""
    out: list[str] = []
    skip = False
    for w in argv:
        if skip:
            skip = False
            continue
        if w == "-o" or w in _DEPFILE_FLAGS_WITH_VALUE:
            skip = True
            continue
        if w in _DEPFILE_FLAGS or w.startswith(("-MF", "-MT", "-MQ")):
            continue
        out.append("-E" if w == "-c" else w)
    return out + ["-dU"]


def nvcc_preprocessings(dryrun: str, macros: tuple[str, ...], output: str) -> tuple[list[list[str]], str | None, dict[str, str]]:
    """From `nvcc --dryrun`'s lines: the commands that receive a name macro, each as a preprocessing
    that prints what it consults; or why there is no proof (a name macro reaches another tool, or
    the object's name reaches anything but the host compiler's last `-c ... -o OUTPUT`). Also the
    variables nvcc sets for its tools (PATH, LD_LIBRARY_PATH)."""
    runs, env = [], {}
    mentions = re.compile(r"(?<![\w./-])" + re.escape(output) + r"(?![\w./-])").search
    for line in dryrun.splitlines():
        if not line.startswith("#$ "):
            continue
        text = line[3:].strip()
        if text.startswith("-- "):  # a step of nvcc's own ("-- Filter Dependencies -- > FILE.d"), no tool
            continue
        name, eq, value = text.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            if name in ("PATH", "LD_LIBRARY_PATH"):
                env[name] = value
            continue
        try:
            words = shlex.split(text)
        except ValueError:
            return [], f"nvcc --dryrun printed a command pp4 cannot read: {text[:120]}", env
        tool = os.path.basename(words[0]) if words else ""
        flags = unprovable_flags(words)
        if flags:
            return [], _flag_problem(flags[0]), env
        named_output = [i for i, w in enumerate(words) if mentions(w)]
        if named_output and not (_HOST_COMPILERS.search(tool) and "-c" in words and named_output == [len(words) - 1]
                                 and words[-2:] == ["-o", output]):
            return [], f"nvcc hands the object's name to {tool or 'a tool'} other than as the host compiler's output", env
        named = [m for m in macros if _receives(words, m)]
        if not named:
            continue
        if not _HOST_COMPILERS.search(tool) or "-E" not in words:
            return [], f"nvcc hands {named[0]} to {tool or 'a tool'}, not only to a preprocessing", env
        if "$" in text:
            return [], f"nvcc's preprocessing command names a variable: {text[:120]}", env
        runs.append(preprocessing_of_compile(words))
    if not runs:
        return [], "nvcc --dryrun shows no preprocessing that receives the name macros", env
    return runs, None, env


def _receives(words: list[str], macro: str) -> bool:
    for i, w in enumerate(words):
        if _defines(w, (macro,)):
            return True
        if w == "-D" and i + 1 < len(words) and words[i + 1].partition("=")[0] == macro:
            return True
    return False


def consulted(text: bytes, macros: tuple[str, ...]) -> list[str]:
    """The name macros a -dU preprocessing consulted (the #define and #undef lines of its text)."""
    alternatives = b"|".join(re.escape(m.encode()) for m in macros)
    found = re.findall(rb"^#(?:define|undef) (" + alternatives + rb")(?![A-Za-z0-9_])", text, re.M)
    return sorted({m.decode() for m in found})


def unproven(argv: list[str], language: str, env: dict[str, str], macros: tuple[str, ...], limits, scratch_parent,
             root) -> str | None:
    """None when this compile's preprocessing is proven not to read the name macros; else why not.
    Every step runs as the compile runs: in its fixed root, under its limits and environment."""
    from pp4.execution.run import run  # a compile edge that never needs a proof never loads it

    def ran(command: list[str], extra_env: dict[str, str] | None = None, stdout: Path | None = None):
        return run(command, {**env, **(extra_env or {})}, limits, scratch_parent, root, observed=False, compile=False,
                   stdout=stdout)

    if language == "cuda":
        dry = ran([*argv, "--dryrun"])
        if dry.returncode != 0:
            return f"nvcc --dryrun failed (exit {dry.returncode})"
        command = list(dry.command)
        output = command[command.index("-o") + 1]
        passes, problem, tool_env = nvcc_preprocessings(dry.stderr.decode(errors="replace"), macros, output)
        if problem is not None:
            return problem
    else:
        flags = unprovable_flags(argv)
        if flags:
            return _flag_problem(flags[0])
        passes, tool_env = [preprocessing_of_compile(list(argv))], {}
    Path(scratch_parent).mkdir(parents=True, exist_ok=True)
    for command in passes:
        fd, text = tempfile.mkstemp(prefix="name-proof-", suffix=".ii", dir=scratch_parent)
        os.close(fd)
        try:
            pre = ran(command, tool_env, stdout=Path(text))
            if pre.returncode != 0:
                return f"its preprocessing with -dU failed (exit {pre.returncode})"
            used = consulted(Path(text).read_bytes(), macros)
        finally:
            os.unlink(text)
        if used:
            return f"its preprocessing reads {', '.join(used)}"
    return None
