"""The package's rooms import in one direction only, and no module imports itself back through another.

Read from the source with `ast` (every import, also those inside functions), so a new upward import fails here
before it becomes a cycle at run time.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trl_multiagent"
ROOMS_ABOVE_WORKFLOWS = ("adapters", "checkpoints", "evaluation", "monitoring", "rollout", "trainer", "training")
TRAINER = ("trainer", "grpo_seam")  # the trainer and its base class over TRL

# room -> rooms (first component under trl_multiagent) it must never import
FORBIDDEN = {
    "workflows": ROOMS_ABOVE_WORKFLOWS + TRAINER + ("tasks", "config", "toy"),
    "tasks": TRAINER + ("adapters", "checkpoints", "evaluation", "monitoring", "rollout", "training"),
    "rollout": TRAINER + ("training", "checkpoints", "evaluation", "monitoring", "config"),
    "adapters": TRAINER + ("training", "checkpoints", "evaluation", "config"),
    "training": TRAINER + ("adapters", "checkpoints", "evaluation", "monitoring"),
    "monitoring": TRAINER + ("training", "adapters", "checkpoints", "evaluation"),
    # loading and saving only: running a loaded workflow (backends, engine, episodes) is evaluation's
    "checkpoints": TRAINER + ("evaluation", "rollout", "training", "monitoring"),
    "toy": ROOMS_ABOVE_WORKFLOWS + TRAINER + ("workflows", "tasks"),
}
THIRD_PARTY_FORBIDDEN = {"workflows": ("torch", "transformers", "peft", "trl", "accelerate")}
# What tasks may read of workflows: the public parsers, never a workflow's own module.
TASKS_MAY_IMPORT_FROM_WORKFLOWS = {"trl_multiagent.workflows", "trl_multiagent.workflows.parsing"}


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


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "trl_multiagent" and len(parts) > 1 else None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_upward_import(module):
    here = room(module)
    imported = MODULES[module]
    bad = sorted(m for m in imported if room(m) in FORBIDDEN.get(here, ()))
    bad += sorted(m for m in imported if m.split(".")[0] in THIRD_PARTY_FORBIDDEN.get(here, ()))
    if here == "tasks":
        bad += sorted(m for m in imported if room(m) == "workflows" and m not in TASKS_MAY_IMPORT_FROM_WORKFLOWS)
    assert not bad, f"{module} ({here}) imports {bad}"


def test_workflows_import_without_torch():
    """What the static check above promises, at run time: the package's ``__init__`` on the way to the workflows
    pulls in no torch (a blocked ``torch`` fails any import of it)."""
    code = "import sys; sys.modules['torch'] = None; import trl_multiagent.workflows"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert run.returncode == 0, run.stderr[-2000:]


def test_no_import_cycles():
    graph = {m: {i for i in imports if i in MODULES and i != m} for m, imports in MODULES.items()}
    # A package's __init__ re-exporting its own modules is not a cycle of rooms: drop edges from a package into
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


@pytest.mark.parametrize("name", ["trainer.py", "grpo_seam.py"])
def test_the_trainer_and_its_seam_are_formatted_without_skips(name):
    lines = (PACKAGE / name).read_text().splitlines()
    skips = [i for i, line in enumerate(lines, 1) if "fmt: skip" in line or "fmt: off" in line]
    assert not skips, f"trl_multiagent/{name} lines {skips} skip the formatter; let ruff format them"
