"""What makes two compiles the same: the parts of an action key, and the checks of its inputs.

A compile is identified in two steps, as ccache's direct mode does:
- the *manifest key* hashes what is known before compiling: the normalized command, the toolchain's
  identity (nvcc, cicc, ptxas, ... and the host compiler, by content), and the environment variables
  that change what a compiler produces;
- each manifest entry then names the inputs (every file of the full dependency file of the compile
  that made it, with its sha256): the entry matches when every input still has those bytes and no
  new header shadows one of them on the include search path. The inputs outside the extension's
  tree are kept as a shared, content-addressed input set (pp4.inputsets). The *action key* hashes
  the manifest key, the unit's own inputs and the names of its input sets, and names the stored
  object.

Normalization makes a command independent of where its tree lives: the object and dependency-file
paths become $OUT and $DEP, an extension's source root becomes $SRC. The "erasable" defines (the
module name, the pybind11 internals id) are taken out and their values kept aside: they matter only
when an input mentions the identifier, which each entry records (see docs/reuse.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import attrs

from pp4.files import sha256_fd

# Variables that change what gcc or nvcc produce without appearing on the command line.
OUTPUT_ENV = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH",
              "SOURCE_DATE_EPOCH", "LIBRARY_PATH")


class CommandError(Exception):
    """A compile command pp4 cannot take apart (no -o, no -c source, no -MF)."""


@attrs.frozen
class CompileArgs:
    argv: tuple[str, ...]
    compiler: str
    source: str
    output: str
    depfile: str
    search_dirs: tuple[str, ...]  # -iquote, -I, -isystem, in the order the compiler searches them


def parse_compile(argv: list[str]) -> CompileArgs:
    output = depfile = source = None
    quote, plain, system = [], [], []
    i = 1
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a == "-o":
            output, i = nxt, i + 2
            continue
        if a == "-MF":
            depfile, i = nxt, i + 2
            continue
        if a == "-c" and nxt is not None and not nxt.startswith("-"):
            source, i = nxt, i + 2
            continue
        if a in ("-isystem", "-I", "-iquote") and nxt is not None:
            {"-isystem": system, "-I": plain, "-iquote": quote}[a].append(nxt)
            i += 2
            continue
        if a.startswith("-I") and len(a) > 2:
            plain.append(a[2:])
        elif a.startswith("-isystem") and len(a) > 8:
            system.append(a[8:])
        i += 1
    if source is None:  # nvcc and gcc also take `-c` alone with the source elsewhere
        cands = [a for a in argv[1:] if a.endswith((".cu", ".cpp", ".cc", ".cxx", ".c")) and not a.startswith("-")]
        source = cands[0] if len(cands) == 1 else None
    missing = [n for n, v in (("-o OUTPUT", output), ("-MF DEPFILE", depfile), ("a source after -c", source)) if v is None]
    if missing:
        raise CommandError(f"the compile command has no {', '.join(missing)}: {' '.join(argv)}")
    src_dir = os.path.dirname(os.path.abspath(source))
    return CompileArgs(tuple(argv), argv[0], source, output, depfile, tuple([src_dir, *quote, *plain, *system]))


def normalize(args: CompileArgs, root: str | None, erasable: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """The command as a key sees it, and the values of the erasable defines it held."""
    erased: dict[str, str] = {}
    out = []
    for a in args.argv:
        if a == args.output:
            out.append("$OUT")
            continue
        if a == args.depfile:
            out.append("$DEP")
            continue
        m = re.match(r"^-D([A-Za-z_][A-Za-z0-9_]*)(=(.*))?$", a)
        if m and m.group(1) in erasable:
            # Left out of the key entirely, so a command that lacks the define (the stock variant
            # has no pybind11 internals tag) can still match one that has it; the values are kept.
            erased[m.group(1)] = m.group(3) or ""
            continue
        out.append(to_src(a, root))
    return out, erased


def to_src(text: str, root: str | None) -> str:
    if root and root in text:
        return text.replace(root, "$SRC")
    return text


def from_src(text: str, root: str | None) -> str:
    return text.replace("$SRC", root) if root else text


def output_env(env: dict[str, str]) -> dict[str, str]:
    return {k: env[k] for k in OUTPUT_ENV if k in env}


def manifest_key(normalized: list[str], toolchain_id: dict, env: dict[str, str]) -> str:
    # format 2: entries name their shared inputs through input sets (pp4.inputsets)
    doc = {"argv": normalized, "toolchain": toolchain_id, "env": env, "format": 2}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def action_key(mkey: str, inputs: list[list[str]], input_sets: list[str], erased: dict[str, str] | None) -> str:
    """inputs: the unit's own inputs with their sha256; input_sets: the names (content hashes) of
    the sets holding the others. erased is None when no input mentions an erasable identifier:
    then its value cannot matter."""
    doc = {"manifest": mkey, "inputs": inputs, "input_sets": input_sets, "erased": erased}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


class FileHasher:
    """sha256 of files, each read once per process; a missing file hashes to None.

    Once per path, and once per file: two paths to one file (a hard link, a folder reached through
    a symbolic link, as /usr/local/cuda/include is) are hashed once, keyed by device, inode, size
    and mtime as fstat gives them for the file just opened, so a file replaced or written since is
    hashed again."""

    def __init__(self):
        self._hashes: dict[str, str | None] = {}
        self._by_file: dict[tuple[int, int, int, int], str] = {}
        self._exists: dict[str, bool] = {}
        self._mentions: dict[tuple[str, bytes], bool] = {}

    def sha256(self, path: str) -> str | None:
        h = self._hashes.get(path, ...)
        if h is ...:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    st = os.fstat(fd)
                    ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                    h = self._by_file.get(ident)
                    if h is None:
                        h = self._by_file[ident] = sha256_fd(fd, st.st_size)
                finally:
                    os.close(fd)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
                h = None
            self._hashes[path] = h
        return h

    def files_hashed(self) -> int:
        """How many distinct files this process has read and hashed."""
        return len(self._by_file)

    def all_match(self, pairs) -> bool:
        """Whether every (path, sha256) still holds: the check of a whole input set, 1,400 pairs, in
        a loop that reads the per-process hashes directly (a set is checked once per process, but
        an EXL3 build has 41 of them)."""
        hashes = self._hashes
        for p, want in pairs:
            got = hashes.get(p, ...)
            if got is ...:
                got = self.sha256(p)
            if got != want:
                return False
        return True

    def exists(self, path: str) -> bool:
        e = self._exists.get(path)
        if e is None:
            e = self._exists[path] = os.path.isfile(path)
        return e

    def mentions(self, path: str, word: bytes) -> bool:
        key = (path, word)
        m = self._mentions.get(key)
        if m is None:
            with open(path, "rb") as f:
                m = self._mentions[key] = word in f.read()
        return m


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a make-style dependency file (gcc -MD, nvcc -MD), unescaped."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    colon = re.search(r"(?<!\\):(\s|$)", text)
    body = text[colon.end():] if colon else ""
    deps, cur, i = [], [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body) and body[i + 1] in " #\\":
            cur.append(body[i + 1])
            i += 2
            continue
        if c == "$" and i + 1 < len(body) and body[i + 1] == "$":
            cur.append("$")
            i += 2
            continue
        if c.isspace():
            if cur:
                deps.append("".join(cur))
                cur = []
        else:
            cur.append(c)
        i += 1
    if cur:
        deps.append("".join(cur))
    return list(dict.fromkeys(deps))


def _depfile_escape(p: str) -> str:
    return p.replace("\\", "\\\\").replace(" ", "\\ ").replace("#", "\\#").replace("$", "$$")


def depfile_body(deps: list[str]) -> str:
    """The prerequisites part of a dependency file; bodies of several lists join with DEPFILE_JOIN."""
    return DEPFILE_JOIN.join(_depfile_escape(d) for d in deps)


DEPFILE_JOIN = " \\\n  "


def format_depfile(output: str, deps: list[str] | None = None, bodies: list[str] | None = None) -> str:
    parts = ([depfile_body(deps)] if deps else []) + [b for b in bodies or [] if b]
    return _depfile_escape(output) + ": " + DEPFILE_JOIN.join(parts) + "\n"


class ShadowFinder:
    """Paths that, if a file existed there, would be found before an input via the search path.

    For an input found under search directory k as <dir_k>/<rel>, a file <dir_j>/<rel> for j < k
    would be included instead: that is the shadowing the reuse rule must notice. `candidates` returns
    those that exist now (recorded when an entry is stored, then compared at lookup). Each input is
    worked out once per process and search path: the 41 input sets of an EXL3 build share nearly all
    of their 1,400 headers, and working each set out afresh cost a quarter of the prepass."""

    def __init__(self, search_dirs: tuple[str, ...], hasher: FileHasher):
        self.dirs = [os.path.normpath(d) for d in search_dirs]
        self.hasher = hasher
        self._of: dict[str, tuple[str, ...]] = {}

    def of(self, p: str) -> tuple[str, ...]:
        """The existing candidates that would shadow one input."""
        found = self._of.get(p)
        if found is None:
            norm = os.path.normpath(p)
            cands = []
            for k, d in enumerate(self.dirs):
                if not norm.startswith(d + os.sep):
                    continue
                rel = norm[len(d) + 1:]
                for e in self.dirs[:k]:
                    cand = os.path.join(e, rel)
                    if cand != norm and self.hasher.exists(cand):
                        cands.append(cand)
            found = self._of[p] = tuple(cands)
        return found

    def candidates(self, inputs: list[str]) -> list[str]:
        found: set[str] = set()
        for p in inputs:
            found.update(self.of(p))
        return sorted(found)


def _hash_binary(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def host_compiler_identity(cache_file: Path) -> dict[str, str]:
    """sha256 of the host compiler nvcc and the C++ rule run (g++ on PATH, its cc1plus, as).

    Cached in a file keyed by each binary's path, size and mtime, so a build hashes them once.
    """
    tools = {}
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx:
        tools["c++"] = os.path.realpath(cxx)
        try:
            cc1 = subprocess.run([cxx, "-print-prog-name=cc1plus"], capture_output=True, text=True).stdout.strip()
            if cc1 and os.path.isfile(cc1):
                tools["cc1plus"] = os.path.realpath(cc1)
        except OSError:
            pass
    asm = shutil.which("as")
    if asm:
        tools["as"] = os.path.realpath(asm)
    stamp = {k: [v, os.stat(v).st_size, os.stat(v).st_mtime_ns] for k, v in tools.items()}
    try:
        cached = json.loads(cache_file.read_text())
        if cached.get("stamp") == stamp:
            return cached["identity"]
    except (OSError, ValueError):
        pass
    identity = {k: _hash_binary(v) for k, v in tools.items()}
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"stamp": stamp, "identity": identity}))
    os.replace(tmp, cache_file)
    return identity
