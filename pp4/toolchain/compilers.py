"""The compilers that run: which ones configure chose, and what each one is at build time.

Configure resolves every compiler to an absolute path, the way torch's BuildExtension chooses them:
.cpp units run $CXX, else `c++`; nvcc runs the host compiler a `-ccbin` in the flags names, else
$CC, else $NVCC_CCBIN, else `gcc` (nvcc's own default), passed as an absolute `-ccbin`. With the
compile environment's fixed PATH (pp4/toolchain/compilerenv.py), nothing on the user's PATH can slip in between.

A compile's identity is the content of what executes: for CUDA units the toolkit's programs and
data files (nvcc, nvcc.profile, cicc, ptxas, ...) and the host compiler nvcc runs; for C++ units the
C++ compiler. A host compiler is its driver file as resolved (a wrapper script's bytes, a
symlink's target), the cc1plus and `as` it reports, and its built-in include folders (the places
`#include <...>` searches last, which the include probes must cover). Each file's sha256 is kept in
build/.pp4/compilers.json with the file's device, inode, size, mtime and ctime, and read again
whenever one of them differs, or when the file changed less than two seconds before it was hashed
(an edit inside the clock's granularity must not keep an old hash).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import attrs

from pp4.files import sha256_file, write_whole

RACY_NS = 2_000_000_000
CACHE_FORMAT = 1


class CompilerError(Exception):
    """A compiler configure was asked to use cannot be found or run."""


@attrs.frozen
class Compilers:
    """The programs configure chose; recorded in build/pp4.json."""

    nvcc: str
    # (role, absolute path) of the toolkit files whose bytes decide nvcc's output: bin/nvcc,
    # bin/nvcc.profile, nvvm/bin/cicc, ... (roles are paths in the toolkit, the same on every machine)
    toolkit: tuple[tuple[str, str], ...]
    ccbin: str  # the host compiler nvcc runs
    cxx: str  # the compiler of .cpp units

    def to_dict(self) -> dict:
        return {"nvcc": self.nvcc, "toolkit": [list(t) for t in self.toolkit], "ccbin": self.ccbin, "cxx": self.cxx}

    @classmethod
    def from_dict(cls, doc: dict) -> "Compilers":
        return cls(doc["nvcc"], tuple((r, p) for r, p in doc["toolkit"]), doc["ccbin"], doc["cxx"])

    def for_language(self, language: str) -> str:
        return self.nvcc if language == "cuda" else self.cxx


def resolve(program: str, what: str, path: str | None = None) -> str:
    """An absolute path for a program named on a command line or in a variable (a name is looked up
    on PATH, a relative path taken from the current folder), in its folder's real path: /bin/c++
    and /usr/bin/c++ are one command where /bin links to /usr/bin, so builds configured with
    either PATH share their objects. The program's own name is kept (a driver acts on the name it
    was started by: c++ compiles C++, gcc C), and its identity follows the link to the content."""
    candidate = shutil.which(program, path=path) if os.sep not in program else os.path.abspath(program)
    if not candidate or not os.path.isfile(candidate) or not os.access(candidate, os.X_OK):
        raise CompilerError(f"{what} {program!r} is not an executable file"
                            + ("" if os.sep in program else " on PATH")
                            + ": install it, or name another one (see docs/configure.md, compilers)")
    candidate = os.path.abspath(candidate)
    return os.path.join(os.path.realpath(os.path.dirname(candidate)), os.path.basename(candidate))


def ccbin_from_flags(flags: list[str]) -> tuple[str | None, list[str]]:
    """A -ccbin/--compiler-bindir in nvcc flags: (its value, the flags without it)."""
    out, value, i = [], None, 0
    while i < len(flags):
        f = flags[i]
        if f in ("-ccbin", "--compiler-bindir") and i + 1 < len(flags):
            value, i = flags[i + 1], i + 2
            continue
        m = re.match(r"^(?:-ccbin|--compiler-bindir)=(.+)$", f)
        if m:
            value, i = m.group(1), i + 1
            continue
        out.append(f)
        i += 1
    return value, out


def choose(env: dict[str, str], nvcc: str, toolkit: list[tuple[str, str]], cuda_flags: list[str]) -> Compilers:
    """Configure's choice of compilers, as torch's BuildExtension would make it."""
    path = env.get("PATH", os.defpath)
    cxx = resolve(env.get("CXX") or "c++", "the C++ compiler ($CXX or c++)", path)
    named, _ = ccbin_from_flags(cuda_flags)
    host = named or env.get("CC") or env.get("NVCC_CCBIN") or "gcc"
    if os.path.isdir(host):  # -ccbin also takes the folder of the default host compiler
        host = os.path.join(host, "gcc")
    ccbin = resolve(host, "the host compiler nvcc runs (-ccbin, $CC, $NVCC_CCBIN or gcc)", path)
    return Compilers(nvcc, tuple(toolkit), ccbin, cxx)


def compile_section(chosen: Compilers, folded, extra_env: dict[str, str]) -> dict:
    """The "compile" part of build/pp4.json: the compilers, each language's environment
    (pp4.toolchain.compilerenv.action_env) and the variables configure folded, as it saw them."""
    from pp4.toolchain.compilerenv import action_env

    envs = {"cuda": action_env(chosen.ccbin, folded, extra_env), "cxx": action_env(chosen.cxx, folded, extra_env)}
    return {"compilers": chosen.to_dict(), "env": envs, "folded": dict(folded.values)}


# ---------------------------------------------------------------------------------------------
# identity at build time


@attrs.frozen
class Identity:
    """What a compile runs: sha256 per role, and the compiler's built-in include folders in search
    order (the "..." folders first, then the <...> ones, then those that do not exist yet)."""

    hashes: dict
    include_dirs: dict  # {"I": [...], "isystem": [...], "system": [...]}: the folders the compiler adds itself


class Identifier:
    """Identities of the compilers of one build, each file hashed once per process and kept in a
    cache file between processes (read again whenever its stamp says the file may have changed)."""

    def __init__(self, cache_file: Path, tmpdir: Path):
        self.cache_file = cache_file
        self.tmpdir = tmpdir
        try:
            doc = json.loads(cache_file.read_text())
            ok = doc.get("format") == CACHE_FORMAT
        except (OSError, ValueError, AttributeError):
            doc, ok = {}, False
        self.hashed: dict[str, list] = doc.get("files", {}) if ok else {}
        self.probes: dict[str, dict] = doc.get("probes", {}) if ok else {}
        self.dirty = False
        self._done: dict[tuple, Identity] = {}

    def save(self) -> None:
        if self.dirty:
            try:
                write_whole(self.cache_file, json.dumps({"format": CACHE_FORMAT, "files": self.hashed,
                                                         "probes": self.probes}, sort_keys=True))
            except OSError:
                pass  # only a cache: the next process hashes again
            self.dirty = False

    def sha256(self, path: str) -> str:
        """The sha256 of what a path runs or reads (symlinks followed)."""
        real = os.path.realpath(path)
        st = os.stat(real)
        stamp = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        cached = self.hashed.get(real)
        if cached and cached[:5] == stamp and cached[6] - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS:
            return cached[5]
        sha = sha256_file(real)
        self.hashed[real] = [*stamp, sha, time.time_ns()]
        self.dirty = True
        return sha

    def identity(self, compilers: "Compilers", language: str, env: dict[str, str]) -> Identity:
        """The identity of a compile of this language run in this environment."""
        key = (compilers, language, env.get("PATH"))
        if key in self._done:
            return self._done[key]
        if language == "cuda":
            hashes = {f"toolkit:{role}": self.sha256(p) for role, p in compilers.toolkit if os.path.isfile(p)}
            host = self._host(compilers.ccbin, env)
            hashes.update({f"host:{k}": v for k, v in host["hashes"].items()})
            nv = self._nvcc_dirs(compilers, env)
            dirs = {"I": nv["I"], "isystem": nv["isystem"], "system": host["include_dirs"]}
        else:
            host = self._host(compilers.cxx, env)
            hashes = {f"host:{k}": v for k, v in host["hashes"].items()}
            dirs = {"I": [], "isystem": [], "system": host["include_dirs"]}
        ident = self._done[key] = Identity(hashes, dirs)
        return ident

    def files(self, compilers: "Compilers", language: str, env: dict[str, str]) -> list[str]:
        """Every file whose bytes make up the identity: ninja rebuilds a compile when one changes."""
        if language == "cuda":
            out = [p for _, p in compilers.toolkit if os.path.isfile(p)]
            probe = self._host(compilers.ccbin, env)
        else:
            out, probe = [], self._host(compilers.cxx, env)
        return out + probe["files"]

    # -- probes of a host compiler, re-run when its driver's file changes --------------------

    @staticmethod
    def _probe_key(env: dict[str, str], *programs: str) -> str:
        parts = []
        for p in programs:
            real = os.path.realpath(p)
            st = os.stat(real)
            parts.append([p, real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
        return json.dumps([parts, env.get("PATH")])

    def _host(self, driver: str, env: dict[str, str]) -> dict:
        key = self._probe_key(env, driver)
        probe = self.probes.get(key)
        if probe is None or not probe.get("ok"):  # a failed probe from an older pp4 is asked again
            probe = self.probes[key] = probe_host(driver, env, self.tmpdir)
            self.dirty = True
        hashes = {"driver": self.sha256(driver)}
        files = [os.path.realpath(driver)]
        for role, path in sorted(probe["programs"].items()):
            if path and os.path.isfile(path):
                hashes[role] = self.sha256(path)
                files.append(os.path.realpath(path))
        return {"hashes": hashes, "include_dirs": probe["include_dirs"], "files": files}

    def _nvcc_dirs(self, compilers: "Compilers", env: dict[str, str]) -> dict:
        key = self._probe_key(env, compilers.nvcc, compilers.ccbin,
                              *[p for role, p in compilers.toolkit if role.endswith("nvcc.profile")])
        probe = self.probes.get(key)
        if probe is None:
            probe = self.probes[key] = probe_nvcc(compilers.nvcc, compilers.ccbin, env, self.tmpdir)
            self.dirty = True
        return probe


def _run(cmd: list[str], env: dict[str, str], tmpdir: Path) -> subprocess.CompletedProcess:
    from pp4.toolchain.compilerenv import process_env

    tmpdir.mkdir(parents=True, exist_ok=True)
    try:
        return subprocess.run(cmd, env=process_env(env, tmpdir), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompilerError(f"cannot run {cmd[0]}: {e}") from None


def probe_host(driver: str, env: dict[str, str], tmpdir: Path) -> dict:
    """The programs a host compiler runs for a C++ compile and its built-in include folders, from
    its own verbose output (`-E -v`), in the compile environment."""
    proc = _run([driver, "-E", "-v", "-x", "c++", "/dev/null"], env, tmpdir)
    if proc.returncode != 0:
        # Its search list would be partial or empty: the probes would then skip the built-in
        # folders. Never used, never cached: the compile fails and the next run asks again.
        raise CompilerError(f"{driver} -E -v failed (exit status {proc.returncode}), so the folders it searches "
                            f"are unknown: {proc.stderr.strip()[-1000:]}")
    programs: dict[str, str | None] = {"cc1plus": None, "as": None}
    quote, angle, missing = [], [], []
    section = None
    for line in proc.stderr.splitlines():
        m = re.match(r'^ignoring nonexistent directory "(.*)"$', line)
        if m:
            missing.append(os.path.normpath(m.group(1)))
            continue
        if line.startswith('#include "..." search starts here'):
            section = quote
            continue
        if line.startswith("#include <...> search starts here"):
            section = angle
            continue
        if line.startswith("End of search list"):
            section = None
            continue
        if section is not None and line.startswith(" "):
            section.append(os.path.normpath(line.strip().removesuffix(" (framework directory)")))
            continue
        words = line.split()
        if words and os.path.basename(words[0]) == "cc1plus" and os.path.isabs(words[0]):
            programs["cc1plus"] = words[0]
    asm = _run([driver, "-print-prog-name=as"], env, tmpdir).stdout.strip()
    if asm:
        programs["as"] = asm if os.path.isabs(asm) else shutil.which(asm, path=env.get("PATH"))
    return {"programs": programs, "include_dirs": list(dict.fromkeys(quote + angle + missing)), "ok": True}


def probe_nvcc(nvcc: str, ccbin: str, env: dict[str, str], tmpdir: Path) -> dict:
    """The include folders nvcc adds itself (its nvcc.profile's INCLUDES and SYSTEM_INCLUDES), read
    from the host-compiler command of a dry run."""
    proc = _run([nvcc, "-ccbin", ccbin, "--dryrun", "-E", "-x", "cu", "/dev/null"], env, tmpdir)
    quote, system = [], []
    for line in proc.stderr.splitlines() + proc.stdout.splitlines():
        if not line.startswith("#$ ") or " -E " not in line:
            continue
        try:
            words = shlex.split(line[3:])
        except ValueError:
            continue
        i = 0
        while i < len(words):
            w = words[i]
            if w == "-I" and i + 1 < len(words):
                quote.append(os.path.normpath(words[i + 1]))
                i += 1
            elif w.startswith("-I"):
                quote.append(os.path.normpath(w[2:]))
            elif w == "-isystem" and i + 1 < len(words):
                system.append(os.path.normpath(words[i + 1]))
                i += 1
            i += 1
        break
    return {"I": quote, "isystem": system}
