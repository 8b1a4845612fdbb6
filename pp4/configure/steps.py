"""configure, top-down: each step reads what the steps before it chose (a Configuration) and adds
its own part; `STEPS` is the order. Every file is written only when its content changes."""

from __future__ import annotations

import json
import os
import shlex
import sys
import sysconfig
from pathlib import Path

import attrs

from pp4 import ninjarun, statedir
from pp4.build import config as buildconfig
from pp4.build import modules as buildmodules
from pp4.configure import MODULE, name_of, rerun_of
from pp4.configure import choices, costs, environment, writing
from pp4.configure.guard import other_configuration
from pp4.configure.options import ConfigureError, check_option_values, parse_args
from pp4.execution import machine
from pp4.execution import root as fixed_root
from pp4.files import write_if_changed
from pp4.plan import estimate
from pp4.plan import modules as plan
from pp4.plan import ninjafile
from pp4.plan.torchflags import older_standard, setuptools_flags, torch_build_flags
from pp4.report import progress
from pp4.sizes import counted, parse_size
from pp4.sources import exl3, listing
from pp4.store.remote import redact
from pp4.toolchain import archs as arch_names
from pp4.toolchain import compat, compilerenv, compilers
from pp4.toolchain import provision as toolchain
from pp4.toolchain.limits import Limits, cpu_text, parse_cpu_list
from pp4.toolchain.torchenv import torch_package_dir


@attrs.define
class Configuration:
    """What configure has chosen so far; each step fills its part."""
    argv: list[str]
    started: tuple[str, ...] = MODULE  # how configure was started, after the interpreter (pp4/configure/__init__.py)
    args: object = None
    root: Path = None
    builddir: Path = None
    builddir_text: str = ""
    remote: dict | None = None
    tc: toolchain.Toolchain = None
    toolchain_inputs: list[str] = attrs.Factory(list)
    toolchain_args: list[str] = attrs.Factory(list)
    archs: list[str] = attrs.Factory(list)
    supported: list[str] = attrs.Factory(list)  # what this nvcc compiles for
    folded: object = None
    exts: list = attrs.Factory(list)
    chosen: compilers.Compilers = None
    compile_section: dict = None
    report: object = None
    plans: list = attrs.Factory(list)
    ordered: list = attrs.Factory(list)
    table: dict = attrs.Factory(dict)
    scale: float = 1.0
    scaled_on: int = 0
    learned: tuple = (1.0, 0)
    tool_files: dict = attrs.Factory(dict)
    cpus: tuple = ()
    jobs: int = 1
    config: dict = None
    source_folders: tuple = ()
    listing_stamp: Path = None
    listing_ignore: tuple = ()
    changed: bool = False
    env_read: dict = attrs.Factory(dict)  # a variable a setup.py read -> that setup.py
    environment: dict = attrs.Factory(dict)  # every variable the build depends on -> its value (None: unset)

    @property
    def envs(self) -> dict:
        return self.compile_section["env"]


def read_options(c: Configuration) -> None:
    c.args = args = parse_args(c.argv, prog=name_of(c.started))
    c.root = Path.cwd()
    c.builddir = (c.root / args.builddir).absolute()
    if "\n" in str(c.builddir):
        raise ConfigureError("--builddir must not contain a newline")
    if "$" in args.builddir:
        raise ConfigureError(f"--builddir {args.builddir}: a `$` in the build directory's name is expanded by nvcc "
                             "as a shell variable; choose a name without `$`")
    check_option_values(args)
    # Before any work: the folders configure writes (build.ninja here, the build folder) must take
    # a write; a read-only one was a traceback from deep inside.
    unwritable = machine.before([c.root, c.builddir], rerun=name_of(c.started))
    if unwritable is not None:
        raise ConfigureError(unwritable)
    other = other_configuration(c.root, c.builddir, rerun_of(c.started))
    if other is not None:
        if not args.replace:
            raise ConfigureError(other)
        print(f"configure: notice: --replace: {other.split(';')[0]}; replacing it (its build folder is left as it is)")
    argv = [a for a in c.argv if a != "--replace"]  # a one-time choice: ninja's re-runs of configure need none
    c.remote = choices.remote_settings(args, c.builddir)
    c.argv = [redact(a) if "://" in a else a for a in argv]  # build.ninja and configure.json never hold a password
    c.builddir_text = (os.path.relpath(c.builddir, c.root) if c.builddir.is_relative_to(c.root)
                       else str(c.builddir))


def choose_toolchain(c: Configuration) -> None:
    c.tc, c.toolchain_inputs, c.toolchain_args = choices.get_toolchain(c.args)
    env_list = os.environ.get(arch_names.TORCH_ENV)
    source = "from --arch"
    if c.args.arch:
        c.archs = arch_names.split(c.args.arch)
    else:  # as torch's BuildExtension chooses: its variable, else the visible GPUs
        c.archs = arch_names.from_torch_env(env_list)
        source = f"from {arch_names.TORCH_ENV}" if c.archs else "from the visible GPUs"
        c.archs = c.archs or choices.visible_gpu_archs()
    if not c.archs:
        raise ConfigureError(f"no GPU is visible here and {arch_names.TORCH_ENV} is "
                             + (f"{env_list!r}" if env_list is not None else "unset")
                             + ", so the target architecture is unknown: pass --arch, e.g. --arch 9.0 for an H100/H200 "
                             f"(or set {arch_names.TORCH_ENV}=9.0 as for torch's BuildExtension)")
    c.supported = choices.supported_archs(c.tc)
    try:
        for a in c.archs:
            plan.parse_arch(a, c.supported)
    except arch_names.ArchError as e:
        if source != f"from {arch_names.TORCH_ENV}":
            raise
        raise ConfigureError(f"{arch_names.TORCH_ENV}={env_list!r}: {e}; set it to what this nvcc supports "
                             "or pass --arch") from None
    print(f"configure: arch {','.join(c.archs)} ({source})")


def fold_environment(c: Configuration) -> None:
    """What the toolchain would read from ours is folded into build.ninja or dropped, never passed
    on unseen (pp4/toolchain/compilerenv.py)."""
    c.folded = compilerenv.fold(dict(os.environ), c.root)
    compilerenv.check_split(str(c.tc.nvcc), c.folded, dict(os.environ), choices.compile_tmpdir(c.builddir))
    for line in compilerenv.folded_lines(c.folded):
        print(f"configure: folded {line}")
    for line in compilerenv.notices(dict(os.environ), c.folded.values, "configure"):
        print(f"configure: notice: {line}")


def choose_extensions(c: Configuration) -> None:
    c.exts = choices.select_extensions(c.args, c.builddir, c.tc, c.archs, c.env_read)
    c.chosen = choices.choose_compilers(c.exts, c.tc, c.folded)
    c.compile_section = compilers.compile_section(c.chosen, c.folded, compilerenv.parse_compile_env(c.args.compile_env))
    c.report = compat.check(c.tc, archs=c.archs, cache_root=c.args.cache_dir.absolute() if c.args.cache_dir else None,
                            ccbin=c.chosen.ccbin, env=c.envs["cuda"])


def plan_modules(c: Configuration) -> None:
    torch = torch_build_flags()
    log, c.table = costs.durations_known(c.builddir, c.root)
    setuptools = None
    if any(e.flavor == "setuptools" for e in c.exts):  # a setup.py's extensions: what build_ext adds
        setuptools = setuptools_flags(dict(os.environ))
        for name in ("CFLAGS", "CPPFLAGS"):
            if os.environ.get(name):
                print(f"configure: folded {name}={os.environ[name]} into the setup.py extensions' C++ flags "
                      "(setuptools adds it to every compile)")
    c.plans = [plan.module_plan(e, torch, c.tc, c.archs, c.builddir, c.root, log, c.supported, c.chosen, c.folded,
                                setuptools) for e in c.exts]
    warn_older_standard(c.plans, torch)
    # The shipped table and the text estimate are the H200's: scaled by how this machine compared
    # on the units this build has timed, once there are enough of them, else by what its builds
    # taught (pp4/plan/estimate.py).
    c.scale, c.scaled_on = plan.machine_scale(c.plans, c.table)
    c.learned = (1.0, 0) if c.scaled_on >= plan.MIN_UNITS_FOR_SCALE else estimate.machine_speed()
    if c.learned[1] >= estimate.SPEED_MIN_UNITS:
        c.scale = c.learned[0]
    c.ordered = plan.longest_first(c.plans, c.table, c.scale)
    identifier = compilers.Identifier(statedir.part(statedir.of_build(c.builddir), statedir.COMPILERS),
                                      choices.compile_tmpdir(c.builddir))
    c.tool_files = {lang: tuple(identifier.files(c.chosen, lang, c.envs[lang])) for lang in ("cuda", "cxx")}
    identifier.save()


def choose_limits_and_store(c: Configuration) -> None:
    args = c.args
    c.cpus = parse_cpu_list(args.cpus) if args.cpus else tuple(sorted(os.sched_getaffinity(0)))
    executor_doc, cluster_cpus = choices.executor_settings(args, c.tc)
    c.jobs = args.jobs if args.jobs is not None else cluster_cpus if cluster_cpus else choices.default_jobs(c.cpus)
    limits = Limits(cpus=c.cpus, nice=args.nice,
                    address_space=parse_size(args.max_memory, positive=True) if args.max_memory else None,
                    nvcc_threads=args.compiler_threads, tmpdir=str(choices.compile_tmpdir(c.builddir)))
    store_dir = None if args.no_reuse else str((args.store or choices.default_store(args)).absolute())
    # The folders every compile sees at fixed paths in its execution root (pp4/execution/root.py).
    places = fixed_root.places_here(str(torch_package_dir()), str(c.tc.prefix), sysconfig.get_paths()["include"],
                                    sys.prefix)
    c.config = {
        "limits": json.loads(limits.to_json()),
        "reuse": {"store": store_dir, "remote": c.remote, "roots": sorted({str(e.root) for e in c.exts}),
                  "relocation": places, "executor": executor_doc,
                  # what tells a unit which module it is for: variants share a unit only where its
                  # preprocessing is proven not to read them (pp4/reuse/variants.py)
                  "name_macros": [plan.MODULE_NAME_MACRO, exl3.PYBIND11_INTERNALS_MACRO],
                  "trust": choices.trust_settings(args),
                  "toolchain": toolchain.identity(c.tc), "state_dir": str(statedir.of_build(c.builddir))},
        "compile": c.compile_section,
    }


def write_build_folder(c: Configuration) -> None:
    # A setup.py often finds its sources by glob: the names in the folders they sit in are an input
    # too (a stamp, written before every other output of configure), so that a source added or
    # removed there makes ninja read the setup.py again, and nothing else written there does
    # (pp4/sources/listing.py).
    c.source_folders = tuple(sorted({str(p.parent) for e in c.exts if "setup.py" in e.provenance
                                     for p in e.source_paths()}))
    dist_dir = (c.root / c.args.dist_dir).absolute()
    c.listing_ignore = (dist_dir.name,) if str(dist_dir.parent) in c.source_folders else ()
    c.listing_stamp = statedir.part(statedir.of_build(c.builddir), statedir.SOURCE_LISTING)
    if c.source_folders:
        listing.write(c.listing_stamp, c.source_folders, c.listing_ignore)
    # The variables the build depends on, each as configure saw it: a change to one runs configure again.
    names = [*compilerenv.FOLDED, *c.env_read]
    if any(e.flavor == "setuptools" for e in c.exts):
        names += SETUPTOOLS_ENV
    c.environment = environment.values(names)
    c.compile_section["environment"] = {"values": c.environment, "read_by_setup_py": dict(sorted(c.env_read.items()))}
    environment.write(statedir.part(statedir.of_build(c.builddir), statedir.ENVIRONMENT), c.environment)
    buildconfig.write(c.builddir, **c.config)
    write_if_changed(c.builddir / "pp4.gdb", fixed_root.gdb_script(str(c.root), c.config["reuse"]["relocation"],
                                                                   [e.root for e in c.exts], str(c.builddir)))
    write_if_changed(buildconfig.actions_path(c.builddir), json.dumps({
        "actions": writing.compile_actions(c.plans, c.chosen, c.envs),
        "links": writing.link_actions(c.plans, c.chosen, c.envs, c.builddir_text),
        "device_links": writing.device_link_actions(c.plans, c.chosen, c.envs),
        "certificate": ninjafile.certificate_path(c.builddir_text)}, indent=1) + "\n")
    # Apart from actions.json: the estimates change with every build's log, the commands do not.
    write_if_changed(statedir.part(statedir.of_build(c.builddir), statedir.ESTIMATES),
                     progress.estimates_doc(c.jobs, {str(s.object): round(plan.expected_ms(p, s, c.table, c.scale) / 1000, 1)
                                                     for p, s in c.ordered},
                                            {str(s.object): round(plan.expected_ms(p, s, c.table) / 1000, 1)
                                             for p, s in c.ordered if s.expected_ms is None}))
    for p in c.plans:
        buildmodules.write_plan(c.builddir, buildmodules.PlanRecord(**writing.plan_record(p, c.tc, c.root)))


# What setuptools' build_ext reads into a setup.py's compiles (pp4/plan/torchflags.py), CC apart (FOLDED).
SETUPTOOLS_ENV = ("CFLAGS", "CPPFLAGS", "CCSHARED")


def write_build_ninja(c: Configuration) -> None:
    config_file, actions_file = buildconfig.config_path(c.builddir), buildconfig.actions_path(c.builddir)
    spec_files = sorted({str(f) for e in c.exts for f in e.spec_files})
    generator_inputs = [*writing.configure_inputs(c.started), str(torch_package_dir() / "version.py"), *spec_files,
                        *c.toolchain_inputs]  # another lock: another prefix, which configure provisions
    settings = ninjafile.BuildSettings(
        python=choices.python_command(), configure=c.started, configure_args=tuple(c.argv),
        ninja=ninjarun.installed(), nvcc=str(c.tc.nvcc), cxx=c.chosen.cxx,  # as in compile_actions
        compile_env={lang: tuple(compilerenv.env_args(e)) for lang, e in c.envs.items()}, tool_files=c.tool_files,
        config=str(config_file), actions=str(actions_file), jobs=c.jobs, builddir=c.builddir_text,
        dist_dir=c.args.dist_dir,
        toolchain_manifest=str(c.tc.prefix / toolchain.MANIFEST) if c.tc.pinned else None,
        toolchain_args=tuple(c.toolchain_args), toolchain_inputs=tuple(c.toolchain_inputs),
        toolchain_key=c.tc.key if c.tc.pinned else None,
        environment=c.environment, environment_test=environment.shell_test(c.environment),
        environment_stamp=str(statedir.part(statedir.of_build(c.builddir_text), statedir.ENVIRONMENT)),
        generator_inputs=tuple(dict.fromkeys(generator_inputs)),
        source_folders=c.source_folders, source_listing=str(c.listing_stamp), source_listing_ignore=c.listing_ignore,
        generator_outputs=(str(config_file), str(actions_file), str(c.builddir / "configure.json"),
                           *(ninjafile.plan_json_path(c.builddir_text, p) for p in c.plans)),
    )
    writing.write_own_bytecode()
    rules = Path(ninjafile.RULES).read_text()
    c.changed = write_if_changed(c.root / "build.ninja", ninjafile.render(settings, rules, c.plans, c.ordered))
    write_if_changed(c.builddir / "configure.json", json.dumps({"argv": c.argv, "cwd": str(c.root)}, indent=1) + "\n")


def warn_older_standard(plans, torch) -> None:
    """Said before anything compiles: a project's -std older than the C++ torch's headers need fails
    in every unit that includes them (BuildExtension adds torch's -std only where a project gives none)."""
    for p in plans:
        for language, flags, what in (("cxx", p.cxx_flags, "C++ flags"), ("cuda", p.cuda_flags, "nvcc flags")):
            old = older_standard(flags, torch.cxx_standard) if any(s.language == language for s in p.steps) else None
            if old:
                print(f"configure: warning: {p.extension.target} compiles with {old} (its {what}), but torch "
                      f"{torch.version}'s headers need {torch.cxx_standard.replace('c++', 'C++')}: its units that "
                      f"include them will fail. Drop {old} from the project's flags (torch's -std="
                      f"{torch.cxx_standard} is used then) or write -std={torch.cxx_standard}")


def say_what_was_chosen(c: Configuration) -> None:
    print(f"configure: {c.report.summary()}")
    print(f"configure: compilers: nvcc {c.chosen.nvcc} with host compiler {c.chosen.ccbin}; C++ {c.chosen.cxx}")
    print(f"configure: {counted(len(c.plans), 'module')}: "
          + ", ".join(f"{p.extension.target} ({counted(len(p.steps), 'unit')})" for p in c.plans))
    print(f"configure: {costs.cost_line(c.plans, c.ordered, c.table, c.jobs, c.scale, c.scaled_on, c.learned[1])}")
    by_target = costs.target_costs(c.ordered, c.table, c.scale)
    if by_target:
        print(f"configure: {by_target}")
    print(f"configure: {c.jobs} job(s) on CPUs {cpu_text(c.cpus)}, nice +{c.args.nice}"
          + (f", {c.args.max_memory} address space per compile" if c.args.max_memory else ""))
    for setup_py in sorted(set(c.env_read.values())):
        read = [n for n, by in sorted(c.env_read.items()) if by == setup_py]
        print(f"configure: {setup_py} read the environment variable(s) "
              + ", ".join(f"{n}={'unset' if c.environment.get(n) is None else repr(c.environment[n])}" for n in read)
              + ": a change to one makes `ninja` run configure again")
    print(f"configure: build.ninja {'written' if c.changed else 'unchanged'}; run `ninja`"
          + (f" (re-run: {rerun_of(c.started)} {shlex.join(c.argv)})" if c.argv else ""))


STEPS = (read_options, choose_toolchain, fold_environment, choose_extensions, plan_modules, choose_limits_and_store,
         write_build_folder, write_build_ninja, say_what_was_chosen)


def main(argv: list[str], started: tuple[str, ...] = MODULE) -> int:
    c = Configuration(list(argv), tuple(started))
    for step in STEPS:
        step(c)
    return 0
