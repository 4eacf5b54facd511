"""Which settings a test function sets, read from its source with `ast` (never a text search, so a comment or a
docstring naming a field does not count).

A test sets a name when the name is the keyword of a call (``tiny_config(beta=0.1)``, ``dict(beta=0.1)``), a string
key of a dict literal (``{"beta": 0.1}``), an attribute it assigns (``args.beta = 0.1``), the name given to
``setattr``/``monkeypatch.setattr`` (``setattr(args, "beta", 0.1)``), a command-line flag in a string
(``"--beta 0.1"``), or a string among its ``pytest.mark.parametrize`` values (``**{switch: True}`` over field names).
Read in the test function, its decorators, and the module-level constants either reads (``SETTINGS = dict(...)``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

FLAG = re.compile(r"(?<![\w-])--([A-Za-z_]\w*)")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the bare string statements (docstrings) under ``tree``."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _names_set(node: ast.AST, docstrings: set[int]) -> set[str]:
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.keyword) and sub.arg:
            found.add(sub.arg)
        elif isinstance(sub, ast.Dict):
            found |= {k.value for k in sub.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
            found.add(sub.attr)
        elif isinstance(sub, ast.Call) and _called(sub) == "setattr" and len(sub.args) >= 2:
            if isinstance(sub.args[1], ast.Constant) and isinstance(sub.args[1].value, str):
                found.add(sub.args[1].value)
        elif isinstance(sub, ast.Call) and _called(sub) == "parametrize":
            for values in sub.args[1:]:
                found |= _strings(values)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and id(sub) not in docstrings:
            found |= set(FLAG.findall(sub.value))
    return found


def _called(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def settings_a_test_sets(path: Path, test: str) -> set[str]:
    """The names test function ``test`` of file ``path`` sets (see the module's docstring); KeyError when the file
    defines no such function."""
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    function = functions[test]
    constants = {
        target.id: statement.value
        for statement in tree.body
        if isinstance(statement, ast.Assign)
        for target in statement.targets
        if isinstance(target, ast.Name)
    }
    found = _names_set(function, docstrings)
    read = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for name in sorted(read & set(constants)):
        found |= _names_set(constants[name], docstrings)
    return found
