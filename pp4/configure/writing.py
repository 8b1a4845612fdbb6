"""What configure writes besides build.ninja and the build's config: the compile and link actions,
each module's plan record, the list of what configure was made of, and pp4's bytecode."""

from __future__ import annotations

import sys
from pathlib import Path

from pp4 import paths
from pp4.configure import script_of
from pp4.configure.costs import DURATION_TABLES
from pp4.plan import modules as plan
from pp4.plan import ninjafile
from pp4.toolchain import compilers
from pp4.toolchain import provision as toolchain


def plan_record(p: plan.ModulePlan, tc: toolchain.Toolchain, root: Path) -> dict:
    ext = p.extension
    return {
        "target": ext.target, "module": ext.module, "root": str(ext.root),
        "sources": [str(s) for s in ext.source_paths()],
        "objects": [str(s.object) for s in p.steps],
        "output": str(p.output), "output_abs": str((root / p.output).absolute()),
        "cuda_flags": list(p.cuda_flags), "cxx_flags": list(p.cxx_flags), "link_flags": list(p.link_flags),
        "toolchain": {"prefix": str(tc.prefix), "key": tc.key, "pinned": tc.pinned,
                      "files": toolchain.identity(tc)},
        "provenance": ext.provenance,
    }


def compile_actions(plans: list[plan.ModulePlan], chosen: compilers.Compilers, envs: dict[str, dict]) -> list[dict]:
    """Every compile command exactly as build.ninja's rules run it (after the wrapper's --), and the
    environment it runs in (per language)."""
    actions = []
    for p in plans:
        for step in p.steps:
            obj = str(step.object)
            argv = [chosen.for_language(step.language), "-MD", "-MF", obj + ".d", *p.flags_for(step),
                    "-c", str(step.source), "-o", obj]
            actions.append({"target": p.extension.target, "output": obj, "source": str(step.source), "argv": argv,
                            "env": envs[step.language]})
    return actions


def link_actions(plans: list[plan.ModulePlan], chosen: compilers.Compilers, envs: dict[str, dict],
                 builddir_text: str) -> list[dict]:
    """Every link command exactly as build.ninja's link rule runs it (after the wrapper's --), with
    its module's pin and plan: what the prepass needs to restore a module ahead of its edges."""
    return [{"target": p.extension.target, "output": str(p.output), "objects": p.link_inputs(),
             "argv": [chosen.cxx, "-shared", *p.link_inputs(), "-o", str(p.output), *p.link_flags],
             "env": envs["cxx"], "plan": ninjafile.plan_json_path(builddir_text, p), "pin": ninjafile.pin_path(p)}
            for p in plans]


def device_link_actions(plans: list[plan.ModulePlan], chosen: compilers.Compilers, envs: dict[str, dict]) -> list[dict]:
    """Every device link (`nvcc -dlink`) exactly as build.ninja's dlink rule runs it (after the
    wrapper's --): the check before ninja decides rechecks what each observed, the certificate lists it."""
    return [{"target": p.extension.target, "output": str(p.dlink_object), "objects": [str(s.object) for s in p.steps],
             "argv": [chosen.nvcc, *(str(s.object) for s in p.steps), "-o", str(p.dlink_object), *p.dlink_flags],
             "env": envs["cuda"]}
            for p in plans if p.dlink_object is not None]


def configure_inputs(started: tuple[str, ...]) -> list[str]:
    """What this run of configure was made of: configure.py where it was started as that script,
    build.ninja.in, every module of pp4 it imported (the plan, the flags, the sources, the facc
    patch's applier, the toolchain's provisioning, ..., and __main__.py where it was started as the
    module) and the data files they read (the patches, the duration tables). A change to any of them
    makes ninja run configure again: a list kept by hand missed some."""
    own = paths.PACKAGE_DIR
    modules = {str(Path(m.__file__)) for m in list(sys.modules.values())
               if getattr(m, "__file__", None) and Path(m.__file__).is_relative_to(own)}
    data = [str(p) for folder in (own / "sources" / "patches", DURATION_TABLES) for p in folder.iterdir() if p.is_file()]
    script = [script_of(started)] if script_of(started) else []
    return [*script, ninjafile.RULES, *sorted(modules), *sorted(data)]


def write_own_bytecode() -> None:
    """A warm build starts Python a few times (the prepass, the recheck, a link or a pin), each
    importing about 40 of pp4's modules; where nothing writes their bytecode as they are imported
    (PYTHONDONTWRITEBYTECODE set, as on some shared machines), each start compiles them again: 0.1
    CPU-s a process. Written here, where stale or missing, into the package's own __pycache__
    folders; a folder that cannot be written only costs that time."""
    import compileall

    compileall.compile_dir(paths.PACKAGE_DIR, quiet=2, workers=1)

