"""The code's size, enforced: no module over 600 lines (outside `in_image/`, whose programs are copied into images
whole), and no function over 80 lines of its own code anywhere in the package. A function's own code is the lines of
its body that are not blank, not its docstring and not inside a function nested in it (those count for themselves);
comments count. Each test names every offender, so a split can be planned from its failure."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "imagekit"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
Function = ast.FunctionDef | ast.AsyncFunctionDef


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def own_lines(func: Function, lines: list[str]) -> int:
    """The lines of ``func``'s own code: its body (comments above the first statement included) less blank lines,
    the docstring and every function nested in it, decorators included."""
    skip: set[int] = set()
    first = func.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        skip |= set(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    for node in ast.walk(func):
        if node is not func and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            skip |= set(range(start, (node.end_lineno or node.lineno) + 1))
    start = first.lineno
    while start - 1 > func.lineno and lines[start - 2].strip().startswith("#"):  # comments the body opens with
        start -= 1
    end = func.end_lineno or func.lineno
    return sum(1 for n in range(start, end + 1) if n not in skip and lines[n - 1].strip())


def functions(path: Path) -> Iterator[tuple[str, int, int]]:
    """(qualified name, line, own-code lines) of every function and method in ``path``, nested ones included."""
    text = path.read_text()
    lines = text.splitlines()

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child.lineno, own_lines(child, lines)
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(text), "")


def test_no_module_outside_in_image_is_over_the_line_limit():
    too_long = [
        f"{_rel(p)}: {n} lines"
        for p in _sources()
        if "in_image" not in p.relative_to(PACKAGE).parts and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split them by responsibility):\n" + "\n".join(
        too_long
    )


@pytest.mark.seconds
def test_no_function_is_over_the_line_limit():
    too_long = [
        f"{_rel(p)}:{line} {name}: {n} lines of its own code"
        for p in _sources()
        for name, line, n in functions(p)
        if n > MAX_FUNCTION_LINES
    ]
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n" + "\n".join(
        too_long
    )


def test_own_code_is_counted_without_blank_lines_docstring_or_nested_functions(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "def outer(\n"
        "    a,\n"
        "):\n"
        '    """Docstring,\n'
        '    two lines."""\n'
        "    # a comment counts\n"
        "    x = 1\n"
        "\n"
        "    @staticmethod\n"
        "    def inner():\n"
        "        return 2\n"
        "\n"
        "    class Local:\n"
        "        y = 3\n"
        "\n"
        "        def method(self):\n"
        "            return 4\n"
        "    return x\n"
    )
    got = {name: n for name, _line, n in functions(source)}
    # outer: the comment, x = 1, class Local:, y = 3, return x
    assert got == {"outer": 5, "outer.inner": 1, "outer.Local.method": 1}
