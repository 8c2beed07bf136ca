"""What a Python module imports, read from its bytecode rather than from `ast`.

CPython 3.11's ast module keeps its recursion depth per interpreter, not per thread: an `ast.parse` in a test while
another thread of the same process parses too (a library in a worker thread) fails with "AST constructor recursion
depth mismatch" (python/cpython#106905). Compiling source to bytecode never builds Python AST objects, so it cannot.
"""
from __future__ import annotations

import dis
import types
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ImportStatement:
    """One `import` or `from … import` of a module: the name as written, its level (dots), the names it takes, and the
    function (or `<module>`) it runs in."""

    name: str
    level: int
    fromlist: tuple[str, ...]
    where: str
    line: int


def import_statements(path: Path | str) -> list[ImportStatement]:
    """Every import statement of the module, at any depth (functions and classes included), in no particular order."""
    found: list[ImportStatement] = []
    pending = [compile(Path(path).read_text(), str(path), "exec")]
    while pending:
        code = pending.pop()
        instructions = list(dis.get_instructions(code))
        for index, instruction in enumerate(instructions):
            if instruction.opname != "IMPORT_NAME":
                continue
            # CPython compiles an import to LOAD_CONST level, LOAD_CONST fromlist, IMPORT_NAME name.
            level, fromlist = instructions[index - 2].argval, instructions[index - 1].argval
            line = instruction.positions.lineno if instruction.positions and instruction.positions.lineno else code.co_firstlineno
            found.append(ImportStatement(instruction.argval, int(level), tuple(fromlist or ()), code.co_name, line))
        pending.extend(constant for constant in code.co_consts if isinstance(constant, types.CodeType))
    return found


def modules_under(roots: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, whether it is a package's __init__), for every .py file under each top-level package
    folder in `roots` (import name -> folder)."""
    modules = {}
    for top, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [top, *path.relative_to(folder).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def imported_modules(module: str, path: Path, is_package: bool, known: set[str] | dict) -> list[tuple[str, ImportStatement]]:
    """The modules of `known` that `module` imports, each with the statement that does: `from package import name`
    imports the submodule `package.name` when there is one, else `package` itself. A package's __init__, which Python runs
    before any of its submodules, is not counted as imported by them (a package that re-exports its submodules is no cycle)."""
    edges = []
    for statement in import_statements(path):
        base = statement.name
        if statement.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[:len(package) - (statement.level - 1)]
            base = ".".join([*package, *([statement.name] if statement.name else [])])
        if statement.fromlist:
            submodules = [f"{base}.{name}" for name in statement.fromlist if f"{base}.{name}" in known]
            targets = submodules + ([base] if len(submodules) < len(statement.fromlist) and base in known else [])
        else:
            parts = base.split(".")
            # `import a.b.c` depends on a.b.c: the deepest of its prefixes that is a module here.
            targets = next(([".".join(parts[:end])] for end in range(len(parts), 0, -1) if ".".join(parts[:end]) in known), [])
        edges += [(target, statement) for target in targets if target != module]
    return edges


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (the import graph is deeper than Python's recursion limit allows to rely on)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components
