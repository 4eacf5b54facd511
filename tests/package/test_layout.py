"""The package's folders import in one direction only, and no module imports itself back through another.

Read from the source with `ast` (every import, also those inside functions), so a new upward import fails here
before it becomes a cycle at run time.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from harness import run_offline

PACKAGE = Path(__file__).resolve().parents[2] / "trl_multiagent"
FOLDERS_ABOVE_WORKFLOWS = ("adapters", "checkpoints", "evaluation", "monitoring", "rollout", "trainer", "training")
# The trainer (its module, its base class over TRL, what it is built from) and the command line above it.
TRAINER = ("trainer", "cli")

# folder -> folders (first component under trl_multiagent) it must never import
FORBIDDEN = {
    "workflows": FOLDERS_ABOVE_WORKFLOWS + TRAINER + ("tasks", "config", "toy", "seams"),
    # Tasks and workflows share the answer readers through common/parse_rules.py, never each other.
    "tasks": TRAINER + ("adapters", "checkpoints", "evaluation", "monitoring", "rollout", "training", "workflows"),
    "rollout": TRAINER + ("training", "checkpoints", "evaluation", "monitoring", "config", "toy"),
    # Adapters report what they measured; monitoring reads it.
    "adapters": TRAINER + ("training", "checkpoints", "evaluation", "config", "monitoring", "toy"),
    "training": TRAINER + ("adapters", "checkpoints", "evaluation", "monitoring", "toy"),
    "monitoring": TRAINER + ("training", "adapters", "checkpoints", "evaluation"),
    # loading and saving only: running a loaded workflow (backends, engine, episodes) is evaluation's
    "checkpoints": TRAINER + ("evaluation", "rollout", "training", "monitoring", "toy"),
    "toy": FOLDERS_ABOVE_WORKFLOWS + TRAINER + ("workflows", "tasks"),
    # What every folder may use (names that moved, model names, answer readers) imports none of them.
    "common": FOLDERS_ABOVE_WORKFLOWS + TRAINER + ("workflows", "tasks", "config", "toy", "seams"),
    # The configuration and its checks sit below the trainer and the command line.
    "config": TRAINER + ("evaluation", "toy"),
    # The trainer never imports the command line or evaluation.
    "trainer": ("cli", "evaluation", "toy"),
}
NO_TORCH = ("torch", "transformers", "peft", "trl", "accelerate")
THIRD_PARTY_FORBIDDEN = {"workflows": NO_TORCH, "common": NO_TORCH}
# Folders below the trainer: they get small explicit inputs (a tokenizer, a model handle, settings), never the trainer.
LOWER_FOLDERS = (
    "adapters",
    "checkpoints",
    "common",
    "config",
    "evaluation",
    "monitoring",
    "rollout",
    "seams",
    "tasks",
    "training",
    "workflows",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved; ``from x import y`` counts as x
    and, when y is a submodule, x.y)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                if (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").is_file() or (
                    PACKAGE.parent / Path(*candidate.split("."))
                ).is_dir():
                    found.add(candidate)
    return found


MODULES = {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "trl_multiagent" and len(parts) > 1 else None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_upward_import(module):
    here = folder(module)
    imported = MODULES[module]
    bad = sorted(m for m in imported if folder(m) in FORBIDDEN.get(here, ()))
    bad += sorted(m for m in imported if m.split(".")[0] in THIRD_PARTY_FORBIDDEN.get(here, ()))
    assert not bad, f"{module} ({here}) imports {bad}"


def test_the_core_never_imports_the_toy_world():
    """The toy world registers its model names with the registry (common/model_names.py), which imports it by the name
    in its ``REGISTRANTS`` on first lookup: no module of the package imports ``trl_multiagent.toy`` (the folders that
    resolve model names, adapters, checkpoints, training and rollout, included)."""
    importing = sorted(
        m for m, imports in MODULES.items() if folder(m) != "toy" and any(folder(i) == "toy" for i in imports)
    )
    assert not importing, f"{importing} import trl_multiagent.toy; resolve model names through model_names instead"
    registry = MODULES["trl_multiagent.common.model_names"]
    assert not any(folder(i) not in (None, "common") for i in registry), registry  # the registry imports no folder


def test_the_seams_import_nothing_of_the_package():
    """The seams (one module per upstream library) sit below every folder, so any folder may use them."""
    seams = {m: imports for m, imports in MODULES.items() if folder(m) == "seams"}
    assert len(seams) > 1  # the package and its modules
    inward = {m: sorted(i for i in imports if folder(i) not in (None, "seams")) for m, imports in seams.items()}
    assert not any(inward.values()), inward


def test_the_layout_check_reads_the_rooms_it_names():
    """The checks above pass vacuously if a folder is renamed away: every folder they name exists."""
    folders = {folder(m) for m in MODULES}
    named = set(FORBIDDEN) | set(LOWER_FOLDERS) | {r for forbidden in FORBIDDEN.values() for r in forbidden}
    assert named <= folders, f"folders named here but not in the package: {sorted(named - folders)}"


@pytest.mark.parametrize("path", sorted(p for p in PACKAGE.rglob("*.py") if folder(module_name(p)) in LOWER_FOLDERS))
def test_lower_rooms_never_take_the_trainer(path):
    """No function below the trainer has a parameter named ``trainer`` (it would read whatever it likes of it,
    duck-typed): the trainer builds a small input for it instead (``BackendContext``, ``LossScale``, ``Bases``)."""
    taking = [
        f"{node.name} (line {node.lineno})"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and "trainer" in {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
    ]
    assert not taking, f"{module_name(path)}: {taking} take the trainer; pass what they need from it instead"


@pytest.mark.slow
def test_workflows_import_without_torch():
    """What the static check above promises, at run time: the package's ``__init__`` on the way to the workflows
    pulls in no torch (a blocked ``torch`` fails any import of it)."""
    code = "import sys; sys.modules['torch'] = None; import trl_multiagent.workflows"
    run_offline([sys.executable, "-c", code], cwd=PACKAGE.parent)


def test_no_import_cycles():
    graph = {m: {i for i in imports if i in MODULES and i != m} for m, imports in MODULES.items()}
    # A package's __init__ re-exporting its own modules is not a cycle of folders: drop edges from a package into
    # its own submodules' imports of the package itself.
    for module, imports in graph.items():
        graph[module] = {i for i in imports if not (i.startswith(module + ".") and module in graph.get(i, set()))}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_no_python_file_skips_the_formatter():
    """ruff formats every line: a statement packed onto fewer lines behind a skip marker hides what it does."""
    root = PACKAGE.parent
    markers = ("fmt: " + "skip", "fmt: " + "off")  # split, so that this file does not name them
    skips = [
        f"{path.relative_to(root)}:{i}"
        for top in ("trl_multiagent", "tests", "recipes", "scripts", "benchmarks")
        for path in sorted((root / top).rglob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if any(marker in line for marker in markers)
    ]
    assert not skips, "these lines skip the formatter; remove the marker and let ruff format them:\n" + "\n".join(
        skips
    )
