"""ESCHER's effort measure (thesis §4.5): the lines of code a policy costs, counted from our own source the way
the paper counts an application's added lines — statements only, without docstrings, comments or blank lines."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Callable


def source_lines(*code: Callable | type) -> int:
    """Lines of the functions and classes in ``code`` once docstrings, comments and blanks are dropped (the
    source is parsed and unparsed, so a statement spread over several lines counts as Python prints it)."""
    total = 0
    for obj in code:
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node) is not None:
                node.body = node.body[1:] or [ast.Pass()]
        total += len(ast.unparse(tree).splitlines())
    return total
