"""What a ``.pt2``'s graph JSON (``models/model.json``) can make torch run, checked before ``torch.export.load``.

Three kinds of strings in that file become code in torch 2.13 (``torch/_export/serde/serialize.py`` and
``torch/export/_unlift.py``):

- ``expr_str`` (every symbolic size) goes to ``sympy.sympify``, which ``eval``s Python source.
- ``guards_code`` is Python source that ``ExportedProgram.module()`` compiles into the module's input guard and runs
  at every call.
- A node's ``target`` is resolved by ``getattr`` from ``torch``, ``operator`` or ``math``: any function there (for
  instance ``torch.save``, ``torch.hub.load``, ``torch.from_file``), called with arguments the file chooses.

Each is checked against the grammar torch's own serializer writes, and anything outside it is refused: symbolic
expressions are sympy constructor calls and arithmetic on size symbols; guards compare sizes of the inputs
(``L['input_ids'].size()[1] <= 8``); targets are operator overloads (``torch.ops.<ns>.<op>.<overload>``, minus the
ones that read files) and the symbolic-int helpers the serializer emits (its ``_SYM_OPS``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["graph_problems"]

_SYMBOL = re.compile(r"[a-z]{1,3}\d{1,9}")
_SYMPY_CALLS = frozenset({
    # sympy's own classes that srepr() writes for size expressions
    "Symbol", "Integer", "Float", "Rational", "Add", "Mul", "Pow", "Max", "Min", "Abs", "Eq", "Ne", "Lt", "Le",
    "Gt", "Ge", "StrictLessThan", "LessThan", "StrictGreaterThan", "GreaterThan", "Equality", "Unequality", "And",
    "Or", "Not", "Piecewise", "ExprCondPair", "floor", "ceiling", "sqrt", "Mod", "BooleanTrue", "BooleanFalse",
    "true", "false", "oo", "zoo", "nan", "Half", "One", "Zero", "NegativeOne",
    # torch.utils._sympy.functions (the deserializer's own sympy_functions table)
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv",
    "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat",
    "Identity", "OpaqueUnaryFn_sqrt", "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or",
})
_SYMPY_KEYWORDS = frozenset({"positive", "integer", "real", "nonnegative", "negative", "finite", "evaluate"})
_GUARD_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})
_GUARD_MODULE_CALLS = {"math": {"floor", "ceil", "trunc", "sqrt"},
                       "torch": {"sym_max", "sym_min", "sym_float", "sym_int", "sym_not", "sym_ite", "sym_sqrt"}}
_GUARD_NAME_CALLS = frozenset({"IsNonOverlappingAndDenseIndicator", "cast_symbool_to_symint_guardless", "max", "min",
                               "abs", "int", "float", "bool", "round"})
_OPERATOR_TARGETS = frozenset({
    "eq", "ne", "le", "ge", "lt", "gt", "neg", "pos", "mul", "add", "sub", "floordiv", "mod", "pow", "truediv",
    "and_", "or_", "lshift", "rshift", "getitem", "not_",
})
_TORCH_TARGETS = frozenset({"sym_not", "sym_int", "sym_float", "sym_ite", "sym_max", "sym_min", "sym_sqrt",
                            "sym_sum", "_sym_sqrt"})
_MATH_TARGETS = frozenset({"trunc", "floor", "ceil", "sqrt"})
_OP_TARGET = re.compile(r"torch\.ops\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")
# operators that reach outside the graph: read a file (aten::from_file), write to the process's stdout (aten::_print)
_OPS_REFUSED = re.compile(r"^torch\.ops\.(aten\.(from_file|_print)|profiler)\b")
_MAX_EXPR = 10_000
_ARITH = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitAnd, ast.BitOr, ast.LShift,
          ast.RShift)
_COMPARE = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def graph_problems(graph: Any) -> list[str]:
    """Every string in the parsed graph JSON that torch would turn into code outside the allowed grammar."""
    problems: list[str] = []
    for key, value in _strings(graph):
        if key == "expr_str":
            why = _expr_problem(value, _sympy_node_ok)
            if why:
                problems.append(f"symbolic size expression {value[:120]!r}: {why}")
        elif key == "guards_code":
            why = _expr_problem(value, _guard_node_ok)
            if why:
                problems.append(f"input guard {value[:120]!r}: {why}")
        elif key == "target":
            why = _target_problem(value)
            if why:
                problems.append(f"graph node target {value[:120]!r}: {why}")
    return problems


def _strings(node: Any, key: str | None = None) -> Iterator[tuple[str | None, str]]:
    """``(key, string)`` for every string under ``node``; list items carry their list's key (iteratively: the file
    is attacker-sized)."""
    stack: list[tuple[str | None, Any]] = [(key, node)]
    while stack:
        key, node = stack.pop()
        if isinstance(node, dict):
            stack.extend((k, v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((key, v) for v in node)
        elif isinstance(node, str):
            yield key, node


def _expr_problem(text: str, node_ok: Any) -> str | None:
    if len(text) > _MAX_EXPR:
        return f"longer than {_MAX_EXPR} characters"
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "not an expression torch writes"
    for node in ast.walk(tree):
        if not node_ok(node):
            return f"{type(node).__name__} {ast.unparse(node)[:60]!r} is outside what torch's serializer writes"
    return None


def _sympy_node_ok(node: ast.AST) -> bool:
    if isinstance(node, (ast.Expression, ast.Load, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd, ast.Compare,
                         ast.BoolOp, ast.And, ast.Or, ast.Not, *_ARITH, *_COMPARE)):
        return True
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id in _SYMPY_CALLS
    if isinstance(node, ast.keyword):
        return node.arg in _SYMPY_KEYWORDS and isinstance(node.value, ast.Constant) and isinstance(
            node.value.value, bool)
    if isinstance(node, ast.Name):
        return node.id in _SYMPY_CALLS or bool(_SYMBOL.fullmatch(node.id))
    if isinstance(node, ast.Constant):
        value = node.value
        return (isinstance(value, (bool, int, float)) or value is None
                or (isinstance(value, str) and bool(_SYMBOL.fullmatch(value))))
    return False


def _guard_node_ok(node: ast.AST) -> bool:
    if isinstance(node, (ast.Expression, ast.Load, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd, ast.Not, ast.Compare,
                         ast.BoolOp, ast.And, ast.Or, *_ARITH, *_COMPARE)):
        return True
    if isinstance(node, ast.Subscript):
        return True  # its value and slice are checked as nodes of their own
    if isinstance(node, ast.Name):
        return node.id == "L" or node.id in _GUARD_NAME_CALLS or node.id in _GUARD_MODULE_CALLS
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id in _GUARD_MODULE_CALLS:
            return node.attr in _GUARD_MODULE_CALLS[node.value.id]
        return node.attr in _GUARD_METHODS
    if isinstance(node, ast.Call):
        return not node.keywords and isinstance(node.func, (ast.Attribute, ast.Name))
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (bool, int, float, str)) or node.value is None
    return False


def _target_problem(target: str) -> str | None:
    if target.startswith("torch.ops."):
        if not _OP_TARGET.fullmatch(target):
            return "not an operator overload name"
        if _OPS_REFUSED.match(target):
            return "an operator that reaches outside the graph (files, the terminal)"
        return None
    module, _, name = target.partition(".")
    allowed = {"_operator": _OPERATOR_TARGETS, "torch": _TORCH_TARGETS, "math": _MATH_TARGETS}.get(module)
    if allowed is not None and name in allowed:
        return None
    return ("a Python function, not an operator: torch would call it with arguments the file chooses "
            "(only torch.ops.* overloads and the symbolic-size helpers are allowed)")
