"""The way pp4's parts depend on each other (shared/design/architecture.md), read from the source
itself: every `import` of a pp4 or pp4_worker module, at the top or inside a function (only what runs
under TYPE_CHECKING is left out: annotations are not dependencies), and every module run or imported
by name (runpy, importlib). Entry points (`__main__` modules) are programs, not layers: inside pp4
they may reach anything of pp4. The worker is a wing of its own (pp4_worker/): pp4 never imports
it, and it needs pp4 only through certify's loader and pin."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PP4 = REPO / "pp4"
WORKER = REPO / "pp4_worker"
OURS = ("pp4", "pp4_worker")  # the top-level packages whose imports are read
COMMON = {"pp4", "pp4.files", "pp4.paths", "pp4.sizes", "pp4.backoff", "pp4.interrupt", "pp4.ninjarun", "pp4.statedir"}
# package -> what it must never import (architecture.md's "Never", and the bottom of the stack)
NEVER = {
    "pp4.build": "everything but the common modules",
    "pp4.toolchain": "everything but the common modules",
    "pp4.store": {"pp4.reuse", "pp4.certify", "pp4.plan", "pp4.sources", "pp4.wheel", "pp4.report"},
    "pp4.plan": {"pp4.reuse", "pp4.store", "pp4.certify", "pp4.wheel"},
    "pp4.sources": {"pp4.certify", "pp4.reuse", "pp4.store", "pp4.plan", "pp4.wheel"},
    "pp4.execution": {"pp4.reuse", "pp4.store", "pp4.certify", "pp4.plan", "pp4.wheel", "pp4.report"},
    "pp4.reuse": {"pp4.certify", "pp4.wheel", "pp4.plan", "pp4.report"},
    "pp4.report": {"pp4.reuse", "pp4.certify", "pp4.store", "pp4.wheel"},
}
# All the worker may take of pp4: a built module, loaded with its pin checked.
WORKER_MAY_USE = {"pp4.certify.loader", "pp4.certify.pin"}
# The one place pp4 names the worker: `python -m pp4.worker`, the documented command, forwarded by
# runpy to pp4_worker by module name (no import; pp4/worker/__main__.py says why it stays).
FORWARDER = "pp4.worker.__main__"
# Calls that run or import a module named by a string: a dependency the way an import is.
BY_NAME = {"run_module", "import_module", "__import__"}
# configure's steps sit on top: nothing else imports them
TOP = {"pp4.configure"}


def module_of(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def ours(name: str) -> bool:
    return name.split(".")[0] in OURS


def imports() -> dict[str, set[tuple[str, str]]]:
    """module -> {(imported module, name imported from it or "")}, for every module of pp4 and
    pp4_worker."""
    found = {}
    for path in sorted([*PP4.rglob("*.py"), *WORKER.rglob("*.py")]):
        name, deps = module_of(path), set()

        class Visitor(ast.NodeVisitor):
            def visit_If(self, node):
                if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                    for child in node.orelse:
                        self.visit(child)
                    return
                self.generic_visit(node)

            def visit_Import(self, node):
                deps.update((a.name, "") for a in node.names if ours(a.name))

            def visit_Call(self, node):
                func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if func in BY_NAME and node.args and isinstance(node.args[0], ast.Constant) and \
                        isinstance(node.args[0].value, str) and ours(node.args[0].value):
                    deps.add((node.args[0].value, ""))
                self.generic_visit(node)

            def visit_ImportFrom(self, node):
                if node.level == 0 and node.module and ours(node.module):
                    for a in node.names:
                        full = f"{node.module}.{a.name}"
                        is_module = (REPO / Path(*full.split("."))).with_suffix(".py").exists() or \
                            (REPO / Path(*full.split("."))).is_dir()
                        deps.add((full, "") if is_module else (node.module, a.name))

        Visitor().visit(ast.parse(path.read_text(), str(path)))
        found[name] = deps
    return found


def package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected parts of more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_another_that_imports_it_back():
    found = imports()
    graph = {m: {d for d, _ in deps if d in found} for m, deps in found.items()}
    assert cycles(graph) == []


def test_pp4_never_imports_the_worker():
    found = imports()
    assert any(m.startswith("pp4_worker.") for m in found), "the layering test must read pp4_worker/"
    wrong = [f"{module} imports {dep}" for module, deps in found.items() if module.split(".")[0] == "pp4"
             for dep, _ in deps if dep.split(".")[0] == "pp4_worker" and module != FORWARDER]
    assert wrong == []
    assert {dep for dep, _ in found[FORWARDER]} == {"pp4_worker"}  # what it runs, and nothing else


def test_the_worker_needs_pp4_only_through_the_loader_and_the_pin():
    found = imports()
    wrong = [f"{module} imports {dep}" for module, deps in found.items() if module.split(".")[0] == "pp4_worker"
             for dep, _ in deps if dep.split(".")[0] == "pp4" and dep not in WORKER_MAY_USE]
    assert wrong == []


def test_no_package_reaches_up():
    found = imports()
    graph: dict[str, set[str]] = {}
    wrong = []
    for module, deps in found.items():
        if module.endswith("__main__") or not module.startswith("pp4."):
            continue
        for dep, _ in deps:
            if dep.split(".")[0] != "pp4":
                continue  # pp4_worker: test_pp4_never_imports_the_worker
            a, b = package(module), package(dep)
            if a == b or b in COMMON:
                continue
            graph.setdefault(a, set()).add(b)
            never = NEVER.get(a, set())
            if never == "everything but the common modules" or b in never or b in TOP:
                wrong.append(f"{module} imports {dep}")
    assert wrong == []
    assert cycles(graph) == []


def test_no_private_name_is_taken_from_another_module():
    wrong = [f"{module} imports {name} from {dep}" for module, deps in imports().items()
             for dep, name in deps if name.startswith("_") and dep != module]
    assert wrong == []


def test_configure_py_is_a_short_script_over_its_package():
    """configure.py and `python -m pp4.configure` (an installed pp4 has no checkout) run one main."""
    text = (REPO / "configure.py").read_text()
    assert len(text.splitlines()) < 60
    assert "from pp4.configure.command import main" in text
    assert "from pp4.configure.command import main" in (REPO / "pp4" / "configure" / "__main__.py").read_text()
    assert "steps.main" in (REPO / "pp4" / "configure" / "command.py").read_text()
