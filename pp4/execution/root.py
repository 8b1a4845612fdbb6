"""The fixed execution root: every compile and link sees its folders at the same paths, in a fresh
process-id space, whatever folder, machine or run it comes from.

An object records where it was compiled: nvcc names an anonymous namespace after its source's real
path and its temporary files (tmpxft_<pid>_...) after its process id; `-g` records the working
folder; `__FILE__` the path as written. So each command runs in a private mount namespace where

    /pp4/work       the folder ninja runs in (build.ninja's)
    /pp4/src        the extension's source root
    /pp4/build      the build folder, when it is not inside /pp4/work
    /pp4/torch, /pp4/toolchain, /pp4/prefix, /pp4/pyinc
                    torch, pp4's pinned toolchain, the Python environment and Python's headers
    /pp4/tmp        an empty temporary folder of its own (TMPDIR)

are bind mounts of this machine's folders, and every other path of the machine is where it is (so a
path a user wrote into a flag still works), in a private process-id namespace (so nvcc's pid is the
same in every run). The command's words that name those folders are rewritten to the fixed paths;
a `-D` value never is: what a user writes into a macro is the user's text, and is keyed as written.

Made with the kernel's namespaces directly (unshare(2), mount(2), chroot(2) through libc): no helper
program, a few system calls per compile. As root (CI, containers) no user namespace is needed;
otherwise an unprivileged user namespace is. Where neither works, `unavailable()` says why and the
command runs where it is, named by its real paths (docs/reuse.md).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import re
import signal

import attrs

FIXED = "/pp4"
TMP = FIXED + "/tmp"
# Which configured folder each fixed path stands for (pp4.json's relocation names them).
PLACES = {"$TORCH": "torch", "$TOOLCHAIN": "toolchain", "$PREFIX": "prefix", "$PYINC": "pyinc"}
TOO_GENERAL = {"/", "/usr", "/usr/local", "/opt", "/home", "/root", "/tmp", "/var", "/etc"}

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 4096, 16384, 1 << 18


@attrs.frozen(cache_hash=True)
class Root:
    """The fixed paths of one command and the folders of this machine behind them."""
    mounts: tuple[tuple[str, str], ...]  # (fixed path, real folder), in mount order
    # (a spelling of a folder, its fixed path), longest first: each folder as configured and with
    # its links resolved (gcc names a system header by its real path). Two roots with the same
    # mounts are the same root, however their folders were spelled.
    aliases: tuple[tuple[str, str], ...] = attrs.field(eq=False)
    cwd: str = attrs.field(default=f"{FIXED}/work", eq=False)
    _table: dict = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self):
        object.__setattr__(self, "_table", {fixed[len(FIXED) + 1:]: real for fixed, real in self.mounts})

    @classmethod
    def make(cls, work: str, places: dict[str, str], source_root: str | None = None,
             build: str | None = None) -> "Root":
        """work: ninja's folder; places: pp4.json's relocation ($TORCH: folder, ...). One object
        per distinct root in a process: a prepass asks for the same one for 194 units."""
        return _made(work, tuple(sorted(places.items())), source_root, build)

    @classmethod
    def _make(cls, work: str, places: dict[str, str], source_root: str | None, build: str | None) -> "Root":
        named = [(f"{FIXED}/work", work)]
        if source_root:
            named.append((f"{FIXED}/src", source_root))
        if build and not _inside(os.path.realpath(build), os.path.realpath(work)):
            named.append((f"{FIXED}/build", build))
        for name, folder in sorted(places.items()):
            if name in PLACES and os.path.isabs(folder) and os.path.normpath(folder) not in TOO_GENERAL:
                named.append((f"{FIXED}/{PLACES[name]}", folder))
        mounts = tuple((fixed, os.path.realpath(folder)) for fixed, folder in named)
        aliases = {(os.path.normpath(folder), fixed) for fixed, folder in named}
        aliases |= {(real, fixed) for fixed, real in mounts}
        return cls(mounts, tuple(sorted(aliases, key=lambda a: (len(a[0]), a), reverse=True)), f"{FIXED}/work")

    @classmethod
    def from_mounts(cls, mounts) -> "Root":
        """The root a record describes by its mounts ([fixed, real] pairs)."""
        mounts = tuple((str(f), str(r)) for f, r in mounts)
        aliases = sorted({(r, f) for f, r in mounts}, key=lambda a: (len(a[0]), a), reverse=True)
        return cls(mounts, tuple(aliases), f"{FIXED}/work")

    def fixed(self, path: str) -> str:
        """A real path as the command sees it in the root (unchanged when under no mounted folder)."""
        for real, fixed in self.aliases:
            if path == real or path.startswith(real + "/"):
                return fixed + path[len(real):]
        return path

    def real(self, path: str) -> str | None:
        """Where a path seen in the root is on this machine; None for the root's own folders
        (/pp4, its temporary folder), which are the same fresh folders in every run. (Called for
        every observation a lookup checks: 15,000 a unit.)"""
        if not path.startswith(FIXED) or (len(path) > len(FIXED) and path[len(FIXED)] != "/"):
            return path
        name, _, tail = path[len(FIXED) + 1:].partition("/")
        real = self._table.get(name)
        if real is None:
            return None  # /pp4 itself, /pp4/tmp, or a name no mount has: nothing of this machine
        return real + "/" + tail if tail else real

    def shown(self, text: bytes) -> bytes:
        """A compiler's messages with the fixed paths put back as this machine's folders, so that
        an error points at the file a user edits."""
        for fixed, real in self.mounts:
            text = text.replace(fixed.encode() + b"/", os.fsencode(real) + b"/")
        return text

    def command(self, argv: list[str]) -> list[str]:
        """argv with every word that names one of the folders rewritten to its fixed path; `-D`
        values and run-time library paths (-rpath) as written: they are the module's, not the
        compile's."""
        out = []
        for i, word in enumerate(argv):
            out.append(word if _is_users(argv, i) else self.rewrite(word))
            if "prefix-map=" in word:
                out += self.prefix_maps_inside(word, argv[i - 1] if i else "")
        return out

    def prefix_maps_inside(self, word: str, prev: str = "") -> list[str]:
        """A user's -fmacro-prefix-map, -ffile-prefix-map or -fdebug-prefix-map=OLD=NEW whose OLD
        lies above a folder the root mounts (a project's own map of its checkout, above the
        extension's root) matches nothing inside the root: the maps that mean there what it means
        outside, each mounted folder under OLD mapped as its path under OLD would be (gcc matches
        OLD as a string prefix, so do these). Given right after the user's, as nvcc's -Xcompiler
        where it came that way."""
        wrap, inner = "", word
        if prev in _PASSING:
            wrap = prev + " "
        else:
            for prefix in _PASSING_PREFIXES[:2]:
                if word.startswith(prefix):
                    wrap, inner = prefix, word[len(prefix):]
        option, eq, mapping = inner.partition("=")
        if option not in _PREFIX_MAPS or not eq or "=" not in mapping or "," in mapping:
            return []
        old, _, new = mapping.partition("=")
        if not old or old.startswith(FIXED):
            return []
        maps = []
        for spelling, fixed in self.aliases:
            if spelling.startswith(old) and spelling != old.rstrip("/") and not fixed.startswith(old):
                maps.append(f"{option}={fixed}={new}{spelling[len(old):]}")
        maps = list(dict.fromkeys(maps))
        if wrap.endswith(" "):
            return [a for m in maps for a in (wrap[:-1], m)]
        return [wrap + m for m in maps]

    def rewrite(self, word: str) -> str:
        """Each occurrence of a folder in a word, where a path starts (the word's start, after `=`,
        `,` or `:`, or after an option's letters such as -I) and ends (a separator or the word's end)."""
        for real, fixed in self.aliases:
            if real in word:
                word = _replace_paths(word, real, fixed)
        return word


@functools.lru_cache(maxsize=256)
def _made(work: str, places: tuple, source_root: str | None, build: str | None) -> Root:
    return Root._make(work, dict(places), source_root, build)


def gdb_script(work: str, places: dict[str, str], source_roots, build: str | None = None) -> str:
    """gdb commands that find the sources of this build's objects from any folder (`source
    build/pp4.gdb`): each fixed path as this machine's folder, and each extension's source root
    searched for the names an object gives relative to it (pp4/execution/run.py: debug_prefix_maps)."""
    root = Root.make(work, places, None, build)
    lines = ["# pp4: where the paths this build's objects name are on this machine (docs/reuse.md).",
             "# Run gdb from an extension's source root, or give gdb this file: gdb -x build/pp4.gdb ..."]
    lines += [f"set substitute-path {fixed} {real}" for fixed, real in root.mounts]
    lines += [f"directory {folder}" for folder in sorted(set(map(str, source_roots)))]
    return "\n".join(lines) + "\n"


def places_here(torch_dir: str, toolchain_prefix: str, python_include: str, prefix: str) -> dict:
    """The folders configure records for this machine (pp4.json's "relocation"), by name."""
    named = {"$TORCH": torch_dir, "$TOOLCHAIN": toolchain_prefix, "$PYINC": python_include, "$PREFIX": prefix}
    return {name: os.path.normpath(folder) for name, folder in named.items()
            if os.path.isabs(folder) and os.path.normpath(folder) not in TOO_GENERAL}


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


# Options whose value is a macro definition: the word after them is the user's text.
_DEFINE_OPTIONS = ("-D", "-U", "--define-macro", "--undefine-macro")
# Options that hand the rest of their word (or the next word) to another program as options:
# gcc's preprocessor (-Wp, a comma list; -Xpreprocessor), nvcc's host compiler (-Xcompiler and
# --compiler-options, comma lists, which nvcc runs through a shell, so spaces split them too).
_PASSING = ("-Xcompiler", "--compiler-options", "-Xpreprocessor")
_PASSING_PREFIXES = ("-Xcompiler=", "--compiler-options=", "-Xpreprocessor=", "-Wp,")
_PREFIX_MAPS = ("-fmacro-prefix-map", "-ffile-prefix-map", "-fdebug-prefix-map")


def _defines(text: str) -> bool:
    """Whether options handed on in one word define or undefine a macro (-DX=..., -UX, however
    nested: -Xcompiler=-Wp,-DX=...)."""
    for prefix in _PASSING_PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix):]
    parts = re.split(r"[,\s]+", text)
    return any(part.startswith(("-D", "-U", "--define-macro", "--undefine-macro"))
               or (part.startswith(_PASSING_PREFIXES) and _defines(part)) for part in parts)


def _is_users(argv: list[str], i: int) -> bool:
    """Whether a word is the user's text, kept as written: a macro's value however it is passed
    (what a user writes into a macro is what the module holds at run time, outside the root), and
    run-time library paths."""
    word = argv[i]
    if "-rpath" in word or (i >= 1 and argv[i - 1] == "-rpath") or (i >= 2 and argv[i - 2] == "-rpath"):
        return True
    if word.startswith(_DEFINE_OPTIONS):
        return True
    prev = argv[i - 1] if i else ""
    if prev in _DEFINE_OPTIONS:
        return True
    if prev in _PASSING or word.startswith(_PASSING_PREFIXES):
        return _defines(word)
    return False


def _replace_paths(word: str, real: str, fixed: str) -> str:
    out, i = [], 0
    while True:
        j = word.find(real, i)
        if j < 0:
            out.append(word[i:])
            return "".join(out)
        end = j + len(real)
        starts = j == 0 or word[j - 1] in "=,:" or (word.startswith("-") and "/" not in word[:j])
        ends = end == len(word) or word[end] in "/,:;= "
        out.append(word[i:j])
        out.append(fixed if starts and ends else real)
        i = end


# ---------------------------------------------------------------------------------------------
# entering it


_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                       ctypes.c_ulong(flags), None), f"mount {source or fstype} on {target}")


def _unshare() -> None:
    """A private mount and process-id namespace (with a user namespace unless this is root)."""
    flags = CLONE_NEWNS | CLONE_NEWPID
    uid, gid = os.geteuid(), os.getegid()
    if uid != 0:
        flags |= CLONE_NEWUSER
    _check(_libc.unshare(flags), "unshare")
    if uid != 0:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)


def _build(root: Root, scratch: str, tmp: str) -> None:
    """The new root under scratch: every top-level entry of / as it is, /proc fresh, and /pp4."""
    new = os.path.join(scratch, "root")
    os.makedirs(new, exist_ok=True)
    _mount("pp4root", new, "tmpfs", MS_NOSUID)
    for name in os.listdir("/"):
        if name in ("proc", FIXED.strip("/")):
            continue
        src, dst = "/" + name, os.path.join(new, name)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isdir(src):
            os.mkdir(dst)
            _mount(src, dst, None, MS_BIND | MS_REC)
        else:
            open(dst, "w").close()
            _mount(src, dst, None, MS_BIND)
    os.mkdir(os.path.join(new, "proc"))
    _mount("proc", os.path.join(new, "proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    fixed_top = os.path.join(new, FIXED.strip("/"))
    os.mkdir(fixed_top)
    for fixed, real in [*root.mounts, (TMP, tmp)]:
        dst = new + fixed
        os.makedirs(dst, exist_ok=True)
        _mount(real, dst, None, MS_BIND | MS_REC)
    os.chroot(new)
    os.chdir(root.cwd)


def enter(root: Root, scratch: str, tmp: str) -> None:
    """Called in a fresh child before it runs the command (subprocess's preexec_fn): enter new
    namespaces, then fork once more, since a new process-id namespace starts with the next child,
    which builds the root and returns to run the command as process 1. This process stays outside,
    waits and exits with the command's status.

    Process ids are part of an object (nvcc's tmpxft_<pid>_ names): in a namespace of its own,
    each process of a compile gets the same id in every run, as long as the same processes start
    it (the observer, pp4-observe, is one of them: an object compiled unobserved has other ids)."""
    _unshare()
    child = os.fork()
    if child == 0:
        _build(root, scratch, tmp)
        return
    _wait_and_exit(child)


def _wait_and_exit(child: int) -> None:
    """Wait for child and exit with its status. A signal that reaches this process (Ctrl-C) kills
    the child: the first process of a namespace ignores signals it has no handler for."""

    def forward(signum, _frame):
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
        os._exit(128 + signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, forward)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
        except OSError as e:
            if e.errno == errno.EINTR:
                continue
            os._exit(127)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


@functools.lru_cache(maxsize=None)
def unavailable(scratch_parent: str) -> str | None:
    """Why commands cannot run in the fixed root here, or None: tried once per process with
    /bin/true, so that the reason is said once and precisely. PP4_NO_ROOT=1 turns it off (to see
    what a machine without namespaces does)."""
    import subprocess

    if os.environ.get("PP4_NO_ROOT"):
        return "PP4_NO_ROOT is set"
    import tempfile

    try:
        os.makedirs(scratch_parent, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix="root-check-", dir=scratch_parent)
    except OSError as e:
        return f"no scratch folder for it ({e})"
    tmp = os.path.join(scratch, "tmp")
    os.mkdir(tmp)
    probe = Root.make(scratch, {})
    err = os.path.join(scratch, "err")
    try:
        with open(err, "w") as f:
            proc = subprocess.run(["/bin/true"], preexec_fn=lambda: _probe(probe, scratch, tmp, f.fileno()),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=f)
        why = open(err).read().strip()
    except (OSError, subprocess.SubprocessError) as e:
        proc, why = None, str(e)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    if proc is not None and proc.returncode == 0:
        return None
    return why.splitlines()[-1] if why else f"the namespace check exited {proc.returncode if proc else '?'}"


def _probe(root: Root, scratch: str, tmp: str, errfd: int) -> None:
    try:
        enter(root, scratch, tmp)
    except OSError as e:
        os.write(errfd, f"{e}\n".encode())
        os._exit(1)
