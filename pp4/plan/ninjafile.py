"""build.ninja: the variables configure chose, the rules of build.ninja.in, and one edge per step.

Written through the ninja_syntax.Writer that the ninja wheel bundles. Compile edges are written
longest-expected-first, since ninja starts ready edges in the order they appear.
"""

from __future__ import annotations

import io
import os
import re
import shlex

import attrs
from ninja import ninja_syntax

from pp4 import paths, statedir
from pp4.plan.modules import CompileStep, ModulePlan
from pp4.sources.extensions import project_wheel_target

# The loader each wheel installs: a new one makes new wheels. (Its path, not an import: plan
# knows nothing of the wheel's code.)
RUNTIME_LOADER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "wheel", "runtime.py")

# What each compile edge starts (a path, as above): it hands the edge to the build's compile server.
REUSE_CLIENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reuse", "client.py")
RECHECK_QUICK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reuse", "quickcheck.py")
EVERY_RUN = "/proc/self"
PREFIX_CHECK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "toolchain", "prefixcheck.py")
# The rules build.ninja is written around: package data, beside this module.
RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build.ninja.in")


@attrs.frozen
class BuildSettings:
    python: list[str]  # the interpreter, with PYTHONPATH when pp4 is not installed
    configure: tuple[str, ...]  # how configure was started, after the interpreter: -m pp4.configure, or a script
    configure_args: tuple[str, ...]
    ninja: str
    nvcc: str
    cxx: str
    compile_env: dict  # language -> --env NAME=VALUE arguments of the wrapper: the compilers' environment
    tool_files: dict  # language -> files whose bytes are the compilers' identity (implicit inputs)
    config: str  # build/pp4.json: limits and reuse settings, read by launcher and wrapper
    actions: str  # build/actions.json: every compile command, for the prepass and the certificate
    jobs: int
    builddir: str
    dist_dir: str  # where `ninja wheel` writes the wheels
    toolchain_manifest: str | None  # None with --cuda-home: nothing to provision
    toolchain_args: tuple[str, ...]
    toolchain_inputs: tuple[str, ...]  # the lock file
    toolchain_key: str | None  # the prefix's key, which its manifest must hold
    generator_inputs: tuple[str, ...]
    # What configure writes besides build.ninja (pp4.json, actions.json, each plan.json): outputs
    # of the generator edge, so that a deleted build folder makes ninja run configure again.
    generator_outputs: tuple[str, ...] = ()
    # A setup.py's source folders: their names (pp4/sources/listing.py's stamp, an input of the
    # generator edge when there are such folders) are listed again when a folder changes, without
    # configure unless they changed.
    source_folders: tuple[str, ...] = ()
    source_listing: str = ""
    source_listing_ignore: tuple[str, ...] = ()
    # The environment variables configure folded, with their values (None: unset), and their stamp
    # (pp4/configure/environment.py): an edge that runs in every ninja run rewrites it where one changed.
    environment: dict = attrs.field(factory=dict)
    environment_stamp: str = ""
    environment_test: str | None = None  # a shell condition true while every value is the same; None: ask Python


def _shell(args) -> str:
    """Arguments as the shell should see them, then escaped for ninja ($ -> $$)."""
    return ninja_syntax.escape(" ".join(shlex.quote(str(a)) for a in args))


def read_variables(text: str) -> dict[str, str]:
    """The top-level variables of a build.ninja this module wrote, as the shell text _shell made
    them: ninja_syntax's wrapped lines (` $` then an indented continuation) joined, `$$` back to `$`.
    How configure reads the configuration a build.ninja it would write over belongs to."""
    joined = re.sub(r" \$\n +", " ", text)
    out = {}
    for line in joined.splitlines():
        m = re.match(r"([A-Za-z_][A-Za-z0-9_.-]*) = (.*)$", line)
        if m:
            out.setdefault(m.group(1), m.group(2).replace("$$", "$"))
    return out


def _escape_path(p) -> str:
    """A path on a build line: $, space and colon escaped, once. (ninja_syntax.escape_path leaves $
    alone, and Writer.build applies it again to what it is given, so neither is used for paths.)"""
    return str(p).replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _build(w: ninja_syntax.Writer, outputs, rule: str, inputs=None, implicit=None, order_only=None,
           variables: dict | None = None) -> None:
    """Writer.build for paths given as they are on disk."""
    def paths(x):
        return [_escape_path(p) for p in ([] if x is None else [x] if isinstance(x, str) else x)]

    ins = paths(inputs) + (["|", *paths(implicit)] if implicit else []) + (["||", *paths(order_only)] if order_only else [])
    w.output.write(_wrapped(["build", *paths(outputs)[:-1], paths(outputs)[-1] + ":", rule, *ins], w.width))
    for key, val in (variables or {}).items():
        w.variable(key, val, indent=1)


def _wrapped(words: list[str], width: int) -> str:
    """One statement, its words (escaped already) joined by spaces and continued with ` $` on new
    lines, indented, where the next word would pass width: ninja_syntax's layout, through the
    writer's public output (its own line writer is private)."""
    lines, line = [], words[0]
    for word in words[1:]:
        if len(line) + 1 + len(word) + 2 > width and line.strip():
            lines.append(line + " $")
            line = "    " + word
        else:
            line += " " + word
    lines.append(line)
    return "\n".join(lines) + "\n"


def _path(p) -> str:
    return str(p)


def prepass_stamp(builddir: str) -> str:
    return os.path.join(builddir, statedir.FOLDER, statedir.PREPASS_STAMP)


def recheck_stamp(builddir: str) -> str:
    return os.path.join(builddir, statedir.FOLDER, statedir.RECHECK_STAMP)


def certificate_path(builddir: str) -> str:
    return os.path.join(builddir, "certificate.json.gz")


def pin_path(plan: ModulePlan) -> str:
    return f"{plan.output}.pin.json"


def plan_json_path(builddir: str, plan: ModulePlan) -> str:
    return os.path.join(builddir, plan.extension.target, "plan.json")


def wheel_stamp_path(builddir: str, target: str) -> str:
    """What `ninja wheel-TARGET` tracks: the wheel's own name holds the source key, known only
    once the module is built."""
    return os.path.join(builddir, target, "wheel.json")


def project_wheel_stamp_path(builddir: str, wheel_target: str) -> str:
    """The record of a setup.py project's last wheel (`ninja wheel-PROJECT`), for replacing it."""
    return os.path.join(builddir, f"{wheel_target}.json")


def project_wheel_stage_path(builddir: str, wheel_target: str) -> str:
    """Where a setup.py project's wheel is staged without its modules (pp4/wheel/project.py)."""
    return os.path.join(builddir, f"{wheel_target}.stage")


# build.ninja's first line (after "# "): how configure knows a build.ninja it may write over is pp4's.
GENERATED = "Generated by configure.py from build.ninja.in. Do not edit: re-run configure.py."


def render(settings: BuildSettings, rules: str, plans: list[ModulePlan],
           ordered: list[tuple[ModulePlan, CompileStep]]) -> str:
    out = io.StringIO()
    w = ninja_syntax.Writer(out, width=100)
    w.comment(GENERATED)
    w.variable("ninja_required_version", "1.10")
    w.variable("builddir", ninja_syntax.escape(settings.builddir))  # .ninja_log and .ninja_deps live here
    w.newline()
    w.variable("python", _shell(settings.python))
    w.variable("reuse_client", _shell([REUSE_CLIENT]))
    w.variable("recheck_quick", _shell([RECHECK_QUICK]))
    w.variable("configure", _shell(settings.configure))
    w.variable("configure_args", _shell(settings.configure_args))
    w.variable("ninja", _shell([settings.ninja]))
    w.variable("nvcc", _shell([settings.nvcc]))
    w.variable("cxx", _shell([settings.cxx]))
    w.variable("cuda_env", _shell(settings.compile_env["cuda"]))
    w.variable("cxx_env", _shell(settings.compile_env["cxx"]))
    w.variable("config", _shell([settings.config]))
    w.variable("actions", _shell([settings.actions]))
    w.variable("toolchain_args", _shell(settings.toolchain_args))
    if settings.toolchain_manifest:
        w.variable("toolchain_check", _shell([PREFIX_CHECK, os.path.dirname(settings.toolchain_manifest),
                                              settings.toolchain_key]))
    w.variable("dist_dir", _shell([settings.dist_dir]))
    w.newline()
    w.pool("compile_pool", settings.jobs)
    w.newline()
    out.write(rules.rstrip() + "\n\n")

    w.comment("Flags of each module, shared by its compile edges.")
    for plan in plans:
        t = _var(plan.extension.target)
        w.variable(f"{t}_cuda_flags", _shell(plan.cuda_flags))
        w.variable(f"{t}_cxx_flags", _shell(plan.cxx_flags))
        w.variable(f"{t}_link_flags", _shell(plan.link_flags))
        if plan.dlink_object is not None:
            w.variable(f"{t}_dlink_flags", _shell(plan.dlink_flags))
    w.newline()

    if settings.toolchain_manifest:
        _build(w, settings.toolchain_manifest, "toolchain", implicit=list(settings.toolchain_inputs))
        _build(w, "toolchain", "phony", settings.toolchain_manifest)
    else:
        _build(w, "toolchain", "phony")
    w.newline()

    stamp = prepass_stamp(settings.builddir)
    _build(w, stamp, "reuse_prepass", implicit=[settings.actions], order_only=["toolchain"])
    w.newline()
    w.comment("Compiles, longest expected first (measured durations: the last .ninja_log or the shipped table).")
    for plan, step in ordered:
        t = _var(plan.extension.target)
        rule = "cuda_compile" if step.language == "cuda" else "cxx_compile"
        _build(w, _path(step.object), rule, str(step.source), implicit=list(settings.tool_files.get(step.language, ())),
               order_only=["toolchain", stamp], variables={"flags": f"${t}_{step.language}_flags"})
    w.newline()

    for plan in plans:
        t = _var(plan.extension.target)
        w.comment(f"{plan.extension.target}: the module {plan.extension.module}")
        out_mod = str(plan.output)
        if plan.dlink_object is not None:
            _build(w, str(plan.dlink_object), "dlink", [str(s.object) for s in plan.steps],
                   variables={"flags": f"${t}_dlink_flags"})
        _build(w, out_mod, "link", plan.link_inputs(), variables={"flags": f"${t}_link_flags"})
        # The pin holds the plan's source key: a plan configure rewrote (another source tree, other
        # provenance) pins the module again even where its bytes did not change; so does an edit of
        # any file the key covers, one that no compile of this module reads included (a header of
        # another module below the same root), which would otherwise leave the pin stale for good.
        _build(w, pin_path(plan), "pin", out_mod,
               implicit=[plan_json_path(settings.builddir, plan),
                         *(str(f) for f in paths.source_tree(plan.extension.root, plan.extension.source_paths()))],
               variables={"plan": _shell([plan_json_path(settings.builddir, plan)]),
                          "target": _shell([plan.extension.target])})
        _build(w, plan.extension.target, "phony", [out_mod, pin_path(plan)])
        _build(w, wheel_stamp_path(settings.builddir, plan.extension.target), "wheel", pin_path(plan),
               implicit=[settings.actions, RUNTIME_LOADER, out_mod, *(str(s.object) for s in plan.steps)],
               variables={"target": _shell([plan.extension.target])})
        _build(w, f"wheel-{plan.extension.target}", "phony", wheel_stamp_path(settings.builddir, plan.extension.target))
        w.newline()

    cert = certificate_path(settings.builddir)
    # Written again whenever any object is rebuilt or restored, or any module relinked (the
    # certificate lists what each link read), not only when a module's bytes change.
    objects = [str(s.object) for _, s in ordered]
    _build(w, cert, "certificate", [pin_path(p) for p in plans],
           implicit=[settings.actions, *objects, *(str(p.output) for p in plans)])
    _build(w, "certify", "audit", variables={"certificate": _shell([cert])})
    w.newline()
    _build(w, "compile_commands.json", "compdb", implicit=["build.ninja"])
    _build(w, "compdb", "phony", "compile_commands.json")
    listing = [settings.source_listing] if settings.source_folders else []
    # The check before ninja decides: build.ninja's edge is the one ninja brings up to date first,
    # and it waits for the check without depending on it (configure never runs for it).
    # (configure writes actions.json, which the check reads: not a dependency, or the two would wait
    # on each other.)
    # It runs once in every ninja run: an edit that kept its file's and its folder's mtimes shows in
    # nothing else ninja reads (pp4/reuse/quickcheck.py). Its input is this ninja's own /proc entry,
    # made when the run started: newer than the check's last run (restat records when it started),
    # older than this run's, so the check runs before build.ninja's edge and not again after it.
    recheck = recheck_stamp(settings.builddir)
    _build(w, recheck, "reuse_recheck", implicit=[EVERY_RUN])
    _build(w, EVERY_RUN, "phony")  # where there is no /proc: always out of date, the check runs twice a run
    env_stamp = [settings.environment_stamp] if settings.environment_stamp else []
    if env_stamp:
        # Run in every ninja run (a phony with no inputs, never a file, is never up to date): the
        # comparison is the shell's, and Python runs only where a value changed.
        test = settings.environment_test
        _build(w, f"{settings.environment_stamp}.now", "phony")
        # configure's other outputs are checked here, not named as the generator edge's outputs: an
        # output of that edge would make every target that reads it reach this edge, and every ninja
        # run would then run it twice and never say "no work to do". One missing (a deleted build
        # folder) rewrites the stamp, and configure runs.
        present = " && ".join(f"[ -e {shlex.quote(p)} ]" for p in settings.generator_outputs)
        _build(w, env_stamp, "environment", implicit=[f"{settings.environment_stamp}.now"],
               variables={"test": ninja_syntax.escape(" && ".join(filter(None, [present, test or "false"]))),
                          "names": _shell(sorted(settings.environment)),
                          "outputs": _shell(a for p in settings.generator_outputs for a in ("--output", p))})
    _build(w, ["build.ninja", *([] if env_stamp else settings.generator_outputs)], "configure",
           implicit=[*settings.generator_inputs, *listing, *env_stamp], order_only=[recheck])
    # An input of configure that is gone (the sources configure unpacks into a deleted build folder,
    # a removed spec or source folder) makes ninja run configure again, which makes it anew or says
    # what is wrong, instead of stopping at "missing and no known rule to make it".
    if listing:
        _build(w, listing, "source_listing", implicit=list(settings.source_folders),
               variables={"folders": _shell(settings.source_folders),
                          "ignore": _shell(a for name in settings.source_listing_ignore for a in ("--ignore", name))})
    for path in (*settings.generator_inputs, *settings.source_folders):
        _build(w, path, "phony")
    w.newline()
    # A setup.py project's modules go into its own wheel (pp4/wheel/project.py), not one wheel each.
    projects: dict[str, list[ModulePlan]] = {}
    for p in plans:
        if (wheel_target := project_wheel_target(p.extension)) is not None:
            projects.setdefault(wheel_target, []).append(p)
    in_projects = {p.extension.target for members in projects.values() for p in members}
    for name, members in projects.items():
        project = {"setup_py": _shell([members[0].extension.provenance["setup.py"]]),
                   "stage": _shell([project_wheel_stage_path(settings.builddir, name)]),
                   "targets": _shell([p.extension.target for p in members]), "project": name[len("wheel-"):]}
        # The setup.py's part needs no module: never made (it runs whenever its wheel is asked
        # for), and free to run beside the compiles.
        _build(w, f"{name}.stage", "project_wheel_stage", implicit=[plan_json_path(settings.builddir, p) for p in members],
               variables=project)
        _build(w, name, "project_wheel", [pin_path(p) for p in members],
               implicit=[f"{name}.stage", settings.actions, *(str(p.output) for p in members),
                         *(str(s.object) for p in members for s in p.steps)],
               variables=dict(project, stamp=_shell([project_wheel_stamp_path(settings.builddir, name)])))
    _build(w, "wheel", "phony", [f"wheel-{p.extension.target}" for p in plans if p.extension.target not in in_projects]
           + list(projects))
    _build(w, "wheel-built", "wheel_built")  # never made: it runs every time, as certify does
    _build(w, "report", "report")
    _build(w, "explain", "explain")
    _build(w, "all", "phony", [p.extension.target for p in plans] + [cert])
    w.default("all")
    return out.getvalue()


def _var(target: str) -> str:
    """A target name as a ninja variable name (letters, digits, _)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in target)
