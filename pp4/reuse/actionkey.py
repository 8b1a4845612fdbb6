"""What makes two compiles the same: the parts of an action key, and the checks of its inputs.

A compile is identified in two steps, as ccache's direct mode does:
- the *manifest key* hashes what is known before compiling: the normalized command, the identity of
  what it runs (nvcc, cicc, ptxas, ... and the host compiler, by content: pp4.compilers), and the
  action's whole environment (pp4.compilerenv);
- each manifest entry then names the inputs (every file of the full dependency file of the compile
  that made it, with its sha256) and the probe digest of its include search (pp4.probes): the entry
  matches when every input still has those bytes and every place the search could look at holds
  the same files as then. The inputs outside the extension's tree are kept as a shared,
  content-addressed input set (pp4.inputsets). The *action key* hashes the manifest key, the unit's
  own inputs, the names of its input sets and its probe digest, and names the stored object.

Normalization makes a command independent of where its tree lives: the object and dependency-file
paths become $OUT and $DEP, an extension's source root becomes $SRC. The "erasable" defines (the
module name, the pybind11 internals id) are taken out and their values kept aside: they matter only
when an input mentions the identifier, which each entry records (see docs/reuse.md).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

import attrs

from pp4.files import canonical_json, sha256_fd


class CommandError(Exception):
    """A compile command pp4 cannot take apart (no -o, no -c source, no -MF)."""


@attrs.frozen
class CompileArgs:
    argv: tuple[str, ...]
    compiler: str
    language: str  # "cuda" (nvcc) or "cxx"
    source: str
    output: str
    depfile: str
    # The include folders the command names, by kind, in command-line order (pp4.probes orders them).
    quote_dirs: tuple[str, ...] = ()  # -iquote
    plain_dirs: tuple[str, ...] = ()  # -I, --include-path
    system_dirs: tuple[str, ...] = ()  # -isystem, --system-include
    after_dirs: tuple[str, ...] = ()  # -idirafter


_DIR_OPTIONS = {"-iquote": "quote", "-I": "plain", "--include-path": "plain", "-isystem": "system",
                "--system-include": "system", "-idirafter": "after"}
_HOST_PASS = ("-Xcompiler", "--compiler-options")


def _include_dirs(argv: list[str], nvcc: bool) -> dict[str, list[str]]:
    """Include folders by kind. nvcc takes comma-separated lists (-Ia,b) and passes -Xcompiler
    options on to the host compiler: both readings are kept, a folder too many only costs a look."""
    found: dict[str, list[str]] = {"quote": [], "plain": [], "system": [], "after": []}

    def add(kind: str, value: str) -> None:
        found[kind].append(value)
        if nvcc and "," in value:
            found[kind].extend(v for v in value.split(",") if v)

    def scan(words: list[str]) -> None:
        i = 0
        while i < len(words):
            a = words[i]
            nxt = words[i + 1] if i + 1 < len(words) else None
            if a in _DIR_OPTIONS and nxt is not None:
                add(_DIR_OPTIONS[a], nxt)
                i += 2
                continue
            if nvcc and a in _HOST_PASS and nxt is not None:
                scan(nxt.split(","))
                i += 2
                continue
            for opt, kind in _DIR_OPTIONS.items():
                if a.startswith(opt) and len(a) > len(opt):
                    value = a[len(opt):]
                    add(kind, value.removeprefix("=") if opt.startswith("--") else value)
                    break
            else:
                for opt in _HOST_PASS:
                    if nvcc and a.startswith(opt + "="):
                        scan(a[len(opt) + 1:].split(","))
            i += 1

    scan(argv)
    return found


def parse_compile(argv: list[str]) -> CompileArgs:
    output = depfile = source = None
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
        i += 1
    if source is None:  # nvcc and gcc also take `-c` alone with the source elsewhere
        cands = [a for a in argv[1:] if a.endswith((".cu", ".cpp", ".cc", ".cxx", ".c")) and not a.startswith("-")]
        source = cands[0] if len(cands) == 1 else None
    missing = [n for n, v in (("-o OUTPUT", output), ("-MF DEPFILE", depfile), ("a source after -c", source)) if v is None]
    if missing:
        raise CommandError(f"the compile command has no {', '.join(missing)}: {' '.join(argv)}")
    nvcc = os.path.basename(argv[0]) == "nvcc"
    dirs = _include_dirs(list(argv[1:]), nvcc)
    return CompileArgs(tuple(argv), argv[0], "cuda" if nvcc or source.endswith(".cu") else "cxx", source, output,
                       depfile, tuple(dirs["quote"]), tuple(dirs["plain"]), tuple(dirs["system"]), tuple(dirs["after"]))


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


def manifest_key(normalized: list[str], toolchain_id: dict, env: dict[str, str], cwd: str | None = None) -> str:
    """toolchain_id: the identity of what the compile runs (pp4.compilers); env: the action's
    environment (pp4.compilerenv); cwd: the folder the compile runs in, for a compile whose object
    records it (embeds_cwd). Format 3: entries carry a probe digest (pp4.probes)."""
    doc = {"argv": normalized, "toolchain": toolchain_id, "env": env, "format": 3}
    if cwd is not None:
        doc["cwd"] = cwd
    return hashlib.sha256(canonical_json(doc)).hexdigest()


# gcc's options that turn debug information on (-g0 turns it off; the last one wins).
_GCC_DEBUG = re.compile(r"^-g(gdb|dwarf|btf|ctf|vms|split-dwarf|z|[1-3]|$)")
# nvcc's own: host (-g) and device (-G, line info) debug information.
_NVCC_DEBUG = {"-g", "--debug", "-G", "--device-debug", "-lineinfo", "--generate-line-info"}
_NVCC_HOST_OPTIONS = {"-Xcompiler", "--compiler-options"}


def embeds_cwd(args: CompileArgs) -> bool:
    """Whether the object records the folder it was compiled in: debug information names it
    (DWARF's DW_AT_comp_dir), so two folders compile the same command to different bytes. Such a
    compile's key includes its folder (as ccache's hash_dir does)."""
    argv = list(args.argv[1:])
    nvcc = args.language == "cuda" and os.path.basename(args.compiler) == "nvcc"
    host: list[str] = []
    debug = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if nvcc and a in _NVCC_HOST_OPTIONS and i + 1 < len(argv):
            host += argv[i + 1].split(",")
            i += 2
            continue
        if nvcc and (a.split("=", 1)[0] in _NVCC_HOST_OPTIONS):
            host += a.split("=", 1)[1].split(",")
        elif nvcc and a in _NVCC_DEBUG:
            return True
        elif not nvcc:
            host.append(a)
        i += 1
    for a in host:
        a = a.strip("'\"")
        if a == "-g0":
            debug = False
        elif _GCC_DEBUG.match(a):
            debug = True
    return debug


NOT_CHECKED = object()  # an entry from before the source-path check: no "source_realpath" field


def action_key(mkey: str, inputs: list[list[str]], input_sets: list[str], erased: dict[str, str] | None,
               probes: str, source_realpath=NOT_CHECKED) -> str:
    """inputs: the unit's own inputs with their sha256; input_sets: the names (content hashes) of
    the sets holding the others; probes: the digest of what its include search could find
    (pp4.probes). erased is None when no input mentions an erasable identifier: then its value
    cannot matter. source_realpath (CUDA units): where the source file really is when the object
    names it (names_its_source_path), None when it was checked not to; part of the key either way,
    so that no entry can claim the check without its key saying so."""
    doc = {"manifest": mkey, "inputs": inputs, "input_sets": input_sets, "erased": erased, "probes": probes}
    if source_realpath is not NOT_CHECKED:
        doc["source_realpath"] = source_realpath
    return hashlib.sha256(canonical_json(doc)).hexdigest()


# nvcc's front end (cudafe++) names an anonymous namespace _GLOBAL__N__<8 hex>_<file>_<8 hex>, where
# the first hash is of the source file's real path (measured: the same unit in two folders gives
# two names; through a symbolic link, the name of the real folder). Such an object is what a
# compile gives only at that path, so its key names the path. Static kernels and static device
# variables (no such name) were measured not to depend on the folder.
_PATH_HASHED_NAME = re.compile(rb"_GLOBAL__N__[0-9a-f]{8}_")


def names_its_source_path(object_bytes: bytes) -> bool:
    return _PATH_HASHED_NAME.search(object_bytes) is not None


def source_path_bound(args: CompileArgs) -> str | None:
    """The real path of a CUDA unit's source when its object names it, else None. (g++ names an
    anonymous namespace _GLOBAL__N_1, whatever the folder: C++ units are never bound.)"""
    try:
        data = Path(args.output).read_bytes()
    except OSError:
        return None
    return os.path.realpath(args.source) if names_its_source_path(data) else None


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
                # Non-blocking, and regular files only: an input named by a stored or remote entry
                # could be a FIFO or /dev/zero, which would hang the build; no compile reads one.
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
                try:
                    st = os.fstat(fd)
                    ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                    h = self._by_file.get(ident)
                    if not stat.S_ISREG(st.st_mode):
                        h = None
                    elif h is None:
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
