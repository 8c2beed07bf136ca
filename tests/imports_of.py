"""The packages a Python module imports, read from its bytecode rather than from `ast`.

CPython 3.11's ast module keeps its recursion depth per interpreter, not per thread: an `ast.parse` in a test while
another thread of the same process parses too (a library in a worker thread) fails with "AST constructor recursion
depth mismatch" (python/cpython#106905). Compiling source to bytecode never builds Python AST objects, so it cannot.
"""
from __future__ import annotations

import dis
import types
from pathlib import Path


def packages_imported(path: Path | str) -> set[str]:
    """The top-level package of every import in the module, at any depth (functions and classes included)."""
    found: set[str] = set()
    pending = [compile(Path(path).read_text(), str(path), "exec")]
    while pending:
        code = pending.pop()
        found.update(instruction.argval.split(".")[0] for instruction in dis.get_instructions(code)
                     if instruction.opname == "IMPORT_NAME")
        pending.extend(constant for constant in code.co_consts if isinstance(constant, types.CodeType))
    return found
