"""Every flag a zonnx message suggests exists (issue 17, item 9: a hint once named '--no-quantize').

The rule is checked on the source: each ``--flag`` inside a string that is not a docstring (messages,
hints, help texts) in the package must be an option of some ``zonnx`` command or of the root command;
docstrings may cite other tools' flags (TPU-MLIR's ``--pixel_format``), messages may not, save pip's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer

from zonnx.tools.main import app

_ROOT = Path(__file__).resolve().parents[2]
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_-]*[a-z0-9])")
#: flags of other programs that messages may name, with the program
_FOREIGN = {"--no-deps": "pip", "--only-binary": "pip"}


def _parser_flags() -> set[str]:
    """Options of every zonnx command, of the root command, and of the setup scripts' argparse parsers."""
    root = typer.main.get_command(app)
    flags = {"--help", "-h"} | _argparse_flags(_ROOT / "tools" / "build_native.py")
    for command in [root, *root.commands.values()]:
        for param in command.params:
            flags.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("--"))
    return flags


def _argparse_flags(path: Path) -> set[str]:
    """The ``add_argument("--x", ...)`` flags of a script, read from its source."""
    flags = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags.update(
                a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")
            )
    return flags


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            ids.add(id(first.value))
    return ids


def _message_flags() -> dict[str, list[str]]:
    """``--flag`` -> the places (file:line) whose non-docstring strings name it."""
    found: dict[str, list[str]] = {}
    for folder in ("zonnx", "tools", "backend", "custom_ops", "converters"):
        for path in sorted((_ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            skip = _docstrings(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                    for match in _FLAG.finditer(node.value):
                        where = f"{path.relative_to(_ROOT)}:{node.lineno}"
                        found.setdefault("--" + match.group(1), []).append(where)
    return found


def test_every_flag_a_message_names_exists() -> None:
    flags = _message_flags()
    assert len(flags) > 30  # the scan sees the messages (it found 80+ flags when written)
    unknown = {f: places for f, places in flags.items() if f not in _parser_flags() and f not in _FOREIGN}
    assert unknown == {}
