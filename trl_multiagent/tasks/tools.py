"""Tools a role can be given (``role_tools={"worker": [calculator]}``): plain functions, described to the model by
their type hints and docstrings. ``run_python`` runs the model's program in the code sandbox (tasks/sandbox.py)."""

from __future__ import annotations

import ast
import operator

from .sandbox import Outcome, SandboxLimits, execute

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_MAX_EXPONENT = 1000  # 9**9**9 would run for minutes


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(3 + 4) * 12".
    """
    return str(_evaluate(ast.parse(expression, mode="eval").body))


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"Exponent {right} is too large (at most {_MAX_EXPONENT}).")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"Not an arithmetic expression: {ast.unparse(node)!r}; use numbers, + - * / // % ** and ().")


RUN_PYTHON_LIMITS = SandboxLimits(cpu_seconds=4, wall_seconds=6.0, memory_bytes=2**30, max_output_bytes=2**16)


def run_python(code: str) -> str:
    """Run a Python program in a sandbox (no network, no files kept) and return what it printed.

    Args:
        code: a complete Python program; it reads no input and prints its results.
    """
    execution = execute(code, limits=RUN_PYTHON_LIMITS)
    if execution.failure is None:
        return execution.stdout
    if execution.failure is Outcome.SANDBOX_ERROR:  # ours, not the program's: the run must not look like its fault
        raise RuntimeError(f"The sandbox could not run the program: {execution.detail}")
    return f"{execution.stdout}\n[{execution.failure.value}] {execution.detail}".strip()
