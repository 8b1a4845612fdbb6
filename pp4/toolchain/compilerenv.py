"""The environment of every compiler and linker process: an allow-list, chosen at configure time.

A compiler reads more than its command line. nvcc expands INCLUDES, PTXAS_FLAGS and the other
variables of its nvcc.profile into the commands it runs, and adds NVCC_PREPEND_FLAGS and
NVCC_APPEND_FLAGS to its own; gcc searches CPATH and CPLUS_INCLUDE_PATH, finds its programs through
GCC_EXEC_PREFIX, COMPILER_PATH and PATH, and writes __DATE__ from SOURCE_DATE_EPOCH; the dynamic
loader lets LD_PRELOAD and LD_LIBRARY_PATH replace code. None of that would be in the key. So a
compile or link gets exactly the variables pp4 chose and nothing else:

- PATH: the folder of the host compiler configure resolved, then /usr/bin and /bin (per language:
  a CUDA compile's host compiler is nvcc's -ccbin, a C++ compile's is the C++ compiler);
- LC_ALL=C: fixed diagnostics and character handling, whatever the shell's locale;
- SOURCE_DATE_EPOCH: the user's value when configure ran, else 0, so __DATE__ and __TIME__ are the
  same in every compile and a stored object is what a compile gives now;
- the variables named with `configure --compile-env NAME=VALUE`;
- TMPDIR (pp4's folder) and CUDA_VISIBLE_DEVICES="" (no GPU), which change no object.

The first four form the action's environment: they are written into build.ninja's commands, so
ninja rebuilds when they change, and the reuse rule keys on them. Of the variables the toolchain
reads, configure folds the ones a user legitimately sets into the commands it writes (`FOLDED`),
and drops the others with a notice (`DROPPED`), at configure time and once per build.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import attrs

# Read by the toolchain and folded by configure into the commands of build.ninja (visible, keyed).
FOLDED = {
    "NVCC_PREPEND_FLAGS": "put before the nvcc flags of every CUDA compile",
    "NVCC_APPEND_FLAGS": "put after the nvcc flags of every CUDA compile",
    "NVCC_CCBIN": "the host compiler nvcc runs (-ccbin), unless the flags or CC name one",
    "CC": "the host compiler nvcc runs (-ccbin, as torch does), unless the flags name one",
    "CXX": "the C++ compiler of .cpp units (as torch does)",
    "CPATH": "each folder added as -I after the others",
    "CPLUS_INCLUDE_PATH": "each folder added as -isystem after the others",
    "SOURCE_DATE_EPOCH": "passed on (default 0): the date and time of __DATE__ and __TIME__",
    # read by torch's BuildExtension, not by a compiler; recorded here so that a change is seen as one
    "TORCH_CUDA_ARCH_LIST": "the architectures when --arch is not given (as torch's BuildExtension reads it)",
}

# Read by the toolchain (nvcc.profile, nvcc, gcc, binutils, the dynamic loader) and never passed on.
# Each with the way to get its effect through the flags instead, which the key does cover.
DROPPED = {
    "INCLUDES": "nvcc.profile adds it to every host-compiler command; use -I/-D in the flags",
    "SYSTEM_INCLUDES": "nvcc.profile adds it to every host-compiler command; use -isystem in the flags",
    "LIBRARIES": "nvcc.profile adds it to nvcc's link commands; use ld_flags",
    "CUDAFE_FLAGS": "nvcc.profile passes it to cudafe++; use -Xcudafe in cuda_flags",
    "PTXAS_FLAGS": "nvcc.profile passes it to ptxas; use -Xptxas in cuda_flags",
    "TOP": "nvcc.profile sets where nvcc's own files are; choose the toolkit with --cuda-home",
    "CICC_PATH": "nvcc.profile sets where cicc is; choose the toolkit with --cuda-home",
    "NVVMIR_LIBRARY_DIR": "nvcc.profile sets where libdevice is; choose the toolkit with --cuda-home",
    "C_INCLUDE_PATH": "searched for C sources only, and pp4 compiles C++ and CUDA",
    "OBJC_INCLUDE_PATH": "searched for Objective-C sources only",
    "GCC_EXEC_PREFIX": "changes where gcc finds cc1plus and as; choose the compiler with CC/CXX",
    "COMPILER_PATH": "changes where gcc finds its programs; choose the compiler with CC/CXX",
    "LIBRARY_PATH": "changes where gcc and ld find libraries; use -L in ld_flags",
    "GCC_COMPARE_DEBUG": "makes gcc compile twice and compare",
    "DEPENDENCIES_OUTPUT": "makes gcc write another dependency file",
    "SUNPRO_DEPENDENCIES": "makes gcc write another dependency file",
    "LD_PRELOAD": "loads other code into every compiler process",
    "LD_AUDIT": "loads other code into every compiler process",
    "LD_LIBRARY_PATH": "changes which libraries the compilers load and ld links; "
                       "use --compile-env LD_LIBRARY_PATH=... if your compiler needs it",
    "LD_RUN_PATH": "ld adds it to the module's run path; use -Wl,-rpath in ld_flags",
    "LDEMULATION": "changes what ld produces",
    "GNUTARGET": "changes the object format binutils assume",
    "COLLECT_GCC_OPTIONS": "gcc's internal hand-over to its sub-programs",
}

# Not passed on and never worth a notice: set in nearly every shell, or diagnostics only.
REPLACED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TMPDIR", "TMP", "TEMP", "GCC_COLORS",
            "GCC_URLS", "TERM_URLS", "GCC_EXTRA_DIAGNOSTIC_OUTPUT", "TERM", "MAKEFLAGS", "CUDA_VISIBLE_DEVICES")

BASE_PATH = ("/usr/bin", "/bin")
DEFAULT_SOURCE_DATE_EPOCH = "0"


class EnvError(ValueError):
    """A --compile-env setting pp4 cannot honour."""


@attrs.frozen
class Folded:
    """What configure took from the environment into the commands it writes."""

    prepend_flags: tuple[str, ...] = ()
    append_flags: tuple[str, ...] = ()
    quote_dirs: tuple[str, ...] = ()  # CPATH, as -I
    system_dirs: tuple[str, ...] = ()  # CPLUS_INCLUDE_PATH, as -isystem
    source_date_epoch: str = DEFAULT_SOURCE_DATE_EPOCH
    values: dict = attrs.field(factory=dict, hash=False)  # NAME -> value as configure saw it


def fold(env: dict[str, str], cwd: Path) -> Folded:
    """The variables of FOLDED that configure turns into flags and settings."""
    def dirs(name: str) -> tuple[str, ...]:
        # An empty element means the current folder (gcc's rule); ninja runs in configure's.
        parts = env[name].split(os.pathsep) if env.get(name) else []
        return tuple(str((cwd / p).absolute()) if p else str(cwd) for p in parts)

    prepend = tuple(nvcc_split(env.get("NVCC_PREPEND_FLAGS", ""), "NVCC_PREPEND_FLAGS"))
    append = tuple(nvcc_split(env.get("NVCC_APPEND_FLAGS", ""), "NVCC_APPEND_FLAGS"))
    epoch = env.get("SOURCE_DATE_EPOCH", DEFAULT_SOURCE_DATE_EPOCH)
    if not epoch.isdigit():
        raise EnvError(f"SOURCE_DATE_EPOCH={epoch!r} is not a number of seconds since 1970: unset it or fix it")
    values = {k: env[k] for k in FOLDED if k in env}
    return Folded(prepend, append, dirs("CPATH"), dirs("CPLUS_INCLUDE_PATH"), epoch, values)


def nvcc_split(text: str, name: str) -> list[str]:
    """NVCC_PREPEND_FLAGS or NVCC_APPEND_FLAGS split into words as nvcc 13.0 splits it (asked of the
    tool: `nvcc -dryrun` with the variable set, what reaches gcc and cudafe++), which is not a
    shell's. Only space and tab separate, outside double quotes; each word is kept as written, quotes
    and backslashes included, and nvcc then reads it as it reads a word of its command line
    (-DVAL="X" defines VAL as the string "X"; a backslash takes the next character). Outside quotes
    a backslash escapes the next character, and before a space, a tab, a quote or the end nvcc
    refuses it; inside quotes a quote right after a backslash does not close them. Where nvcc would
    refuse the text, so does this (check_split then asks nvcc itself)."""
    words, word, started, quoted, i = [], [], False, False, 0
    while i < len(text):
        c = text[i]
        if quoted:
            if c == '"' and text[i - 1] != "\\":
                quoted = False
        elif c == "\\":
            if i + 1 >= len(text) or text[i + 1] in ' \t"':
                raise EnvError(f"{name}={text!r}: nvcc refuses a backslash before "
                               f"{'the end' if i + 1 >= len(text) else repr(text[i + 1])} outside double quotes "
                               "(it splits this variable itself, not as a shell does): fix the quoting")
            word.append(c)
            started, c, i = True, text[i + 1], i + 1
        elif c in " \t":
            if started:
                words.append("".join(word))
            word, started, i = [], False, i + 1
            continue
        else:
            quoted = c == '"'
        word.append(c)
        started, i = True, i + 1
    if quoted:
        raise EnvError(f"{name}={text!r}: a double quote is not closed, which nvcc refuses: fix the quoting")
    if started:
        words.append("".join(word))
    return words


def check_split(nvcc: str, folded: Folded, env: dict[str, str], scratch: Path) -> None:
    """Ask nvcc whether it splits NVCC_PREPEND_FLAGS and NVCC_APPEND_FLAGS as nvcc_split did: its
    -dryrun commands with the variables set, and with the words on its command line instead, must be
    the same. A difference, or nvcc refusing the variables, is an EnvError naming what nvcc said."""
    given = {k: env[k] for k in ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS") if env.get(k)}
    if not given:
        return
    source = scratch / "pp4-split.cu"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text("\n")
    base = {"PATH": env.get("PATH", os.pathsep.join(BASE_PATH)), "LC_ALL": "C"}
    args = ["-dryrun", "-c", str(source), "-o", str(source) + ".o"]

    def commands(argv, extra):
        done = subprocess.run([nvcc, *argv], env={**base, **extra}, capture_output=True, text=True)
        said = done.stdout + done.stderr
        for k, v in extra.items():  # nvcc echoes the variables it read
            said = said.replace(f'#$ {k}="{v}"\n', "")
        return done.returncode, re.sub(r"tmpxft_[0-9a-f]+_", "tmpxft_", said)

    rc, with_env = commands(args, given)
    if rc != 0:
        said = next((ln for ln in with_env.splitlines() if "fatal" in ln), with_env.strip()[-300:])
        raise EnvError(f"{' '.join(f'{k}={v!r}' for k, v in given.items())}: nvcc refuses it ({said.strip()}): "
                       "fix the variable, or unset it")
    _, with_words = commands([*folded.prepend_flags, *args, *folded.append_flags], {})
    if with_words != with_env:
        raise EnvError(f"{' '.join(f'{k}={v!r}' for k, v in given.items())}: pp4 cannot split it into words as "
                       "this nvcc does (its -dryrun commands differ): write the flags without backslashes, or "
                       "put them in the spec's cuda_flags")


def parse_compile_env(items: list[str]) -> dict[str, str]:
    """--compile-env NAME=VALUE settings."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise EnvError(f"--compile-env {item!r}: write it as NAME=VALUE")
        if name in ("PATH", "TMPDIR", "CUDA_VISIBLE_DEVICES", "LC_ALL", "SOURCE_DATE_EPOCH") or name in FOLDED:
            raise EnvError(f"--compile-env {name}: pp4 sets {name} itself (docs/reuse.md, the compile environment)"
                           + (f"; {name} is taken from the environment at configure time" if name in FOLDED else ""))
        out[name] = value
    return out


def action_env(host_compiler: str, folded: Folded, extra: dict[str, str]) -> dict[str, str]:
    """The variables a compile's compilers get that can change its output: part of its key. PATH
    holds the host compiler's folder (where a toolset keeps its own `as`), then /usr/bin and /bin."""
    path = list(dict.fromkeys([os.path.dirname(host_compiler), *BASE_PATH]))
    return {"PATH": os.pathsep.join(path), "LC_ALL": "C", "SOURCE_DATE_EPOCH": folded.source_date_epoch, **extra}


def process_env(action: dict[str, str], tmpdir: Path) -> dict[str, str]:
    """The whole environment of a compiler or linker process: the action's variables, a temporary
    folder, no GPU. Nothing of the caller's environment."""
    return {**action, "TMPDIR": str(tmpdir), "CUDA_VISIBLE_DEVICES": ""}


def env_args(action: dict[str, str]) -> list[str]:
    """The action's environment as command-line arguments of the wrapper: --env NAME=VALUE ..."""
    out = []
    for k in sorted(action):
        out += ["--env", f"{k}={action[k]}"]
    return out


def parse_env_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split leading --env NAME=VALUE pairs off a wrapper's arguments."""
    env, i = {}, 0
    while i + 1 < len(argv) and argv[i] == "--env":
        k, _, v = argv[i + 1].partition("=")
        env[k] = v
        i += 2
    return env, argv[i:]


def notices(env: dict[str, str], folded_values: dict[str, str], when: str) -> list[str]:
    """One line per toolchain variable that is set here and will not reach the compilers as set.

    when: "configure" (the values are being folded now) or "build" (compared with what configure
    folded)."""
    lines = []
    for name, why in DROPPED.items():
        if name in env:
            lines.append(f"{name} is set and not passed to the compilers ({why})")
    if when == "build":
        for name in FOLDED:
            now, then = env.get(name), folded_values.get(name)
            if now != then:
                lines.append(f"{name} is {_shown(now)} here but was {_shown(then)} when configure ran: "
                             "this compile uses the configured value; the next `ninja` runs configure again")
    return lines


def folded_lines(folded: Folded) -> list[str]:
    """What configure took from the environment, one line each, for its report."""
    return [f"{name}={value!r} {FOLDED[name]}" for name, value in sorted(folded.values.items())]


def _shown(value: str | None) -> str:
    return "unset" if value is None else repr(value)
