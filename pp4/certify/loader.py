"""Load a module pp4 built, after checking it against its pin.

    from pp4.certify.loader import load
    p2p = load("build/p2p/pp4_p2p.cpython-311-x86_64-linux-gnu.so")   # or load_target("p2p")
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from pp4.certify.pin import check


def load(module_path: Path | str) -> ModuleType:
    module_path = Path(module_path).absolute()
    pin = check(module_path)
    name = pin["module"]
    if name in sys.modules:
        loaded = sys.modules[name]
        if Path(getattr(loaded, "__file__", "")).resolve() != module_path.resolve():
            raise ImportError(f"another module named {name} is already loaded from {loaded.__file__}")
        return loaded
    import torch  # noqa: F401  - extension modules need torch's libraries loaded first

    loader = importlib.machinery.ExtensionFileLoader(name, str(module_path))
    spec = importlib.util.spec_from_file_location(name, module_path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


def load_target(target: str, builddir: Path | str = "build") -> ModuleType:
    """Load the module of one configured extension target ("p2p", "exl3-facc", ...)."""
    from pp4.build import modules

    if not modules.plan_path(builddir, target).is_file():
        raise ImportError(f"{target} is not configured in {builddir}: run `python -m pp4.configure` and "
                          f"`ninja {target}`")
    try:
        plan = modules.load_plan(builddir, target)
    except modules.BuildFolderError as e:
        raise ImportError(str(e)) from None
    return load(Path(plan.output_abs))
