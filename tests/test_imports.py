"""The package's import graph has no cycle, counting the imports inside functions (imports that
only type checkers run, under `if TYPE_CHECKING:`, do not count)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "rlmlab"


def module_names(root: Path = PACKAGE) -> dict[str, Path]:
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _dynamic_targets(node: ast.AST, modules: dict[str, Path]) -> list[str]:
    """The modules an `importlib.import_module(...)` call may import: the one a string names, or
    every module an f-string's pattern matches (`f"rlmlab.cli.{name}_cmd"`)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
            and node.args):
        return []
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if isinstance(arg, ast.JoinedStr):
        pattern = "".join(re.escape(v.value) if isinstance(v, ast.Constant) else r"[A-Za-z0-9_.]+" for v in arg.values)
        return [m for m in modules if re.fullmatch(pattern, m)]
    return []


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """{module: package modules it imports}, at module level, inside functions or through
    `importlib.import_module`. `from a import b` counts as importing the submodule `a.b` when
    there is one, else the module `a`."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            dynamic = _dynamic_targets(node, modules)
            if dynamic:
                candidates = dynamic
            elif isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                candidates = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in candidates:
                while target and target not in modules:  # `import rlmlab.x.y as z` of a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a list of modules (first == last), or None."""
    state, path = {}, []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph(module_names())
    assert "rlmlab.experiments.kinds.iid" in graph and graph["rlmlab.cli"]  # the walk found the package
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed to the package's parts (`rlmlab.experiments`, `rlmlab.shortcuts`,
    a top-level module such as `rlmlab.errors`): two parts that import each other are one
    design, whichever modules do it."""
    def part(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        if m == "rlmlab":
            continue
        out.setdefault(part(m), set()).update(part(t) for t in targets if part(t) != part(m) and t != "rlmlab")
    return out


def test_the_package_parts_import_each_other_one_way():
    cycle = find_cycle(package_graph(import_graph(module_names())))
    assert cycle is None, " -> ".join(cycle)


def test_attention_sits_on_the_task_alone():
    """Layouts, backends and positions are shared by training and decoding, so they import
    neither: only the task and the modules under every package."""
    parts = package_graph(import_graph(module_names()))
    assert parts["rlmlab.attention"] <= {"rlmlab.task", "rlmlab.errors"}, parts["rlmlab.attention"]
    assert "rlmlab.attention" in parts["rlmlab.learning"] and "rlmlab.attention" in parts["rlmlab.decoding"]


def test_the_architecture_page_counts_the_token_path_it_lists():
    """docs/architecture.md lists a token's path module by module and counts it; the modules
    exist and the counts hold (lines within a tenth, so that the page is re-counted as it drifts)."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    table = text.split("## One token's path")[1].split("That is ")[0]
    listed = [m for line in table.splitlines() if line.startswith("| ") and not line.startswith("| step")
              for m in re.findall(r"`([a-z_/]+\.py)`", line.split("|")[2])]
    assert all((PACKAGE / m).is_file() for m in listed), [m for m in listed if not (PACKAGE / m).is_file()]
    stated = re.search(r"That is (\d+) modules and ([\d,]+) lines", text)
    lines = sum(len((PACKAGE / m).read_text().splitlines()) for m in listed)
    assert int(stated[1]) == len(listed) == len(set(listed))
    assert abs(int(stated[2].replace(",", "")) - lines) <= lines / 10, lines


def test_the_architecture_page_code_walks_one_expression_to_rm_s_answer(tmp_path):
    """The path in code on docs/architecture.md runs as printed: the trace, one CoT example (the
    whole trace), several RM examples (one per active frame, each shorter than the trace), and
    the released RM's greedy answer, which is the expression's value."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)[1]
    script = tmp_path / "walk.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    trace, cot, rm, answer = out.stdout.splitlines()
    n_cot, n_rm = (int(re.match(r"\w+: (\d+) examples", line)[1]) for line in (cot, rm))
    assert n_cot == 1 and cot.endswith(trace) and n_rm > 1 and len(rm) < len(cot)
    said, value = re.fullmatch(r"RM answers (\S+); the value is (\S+)", answer).groups()
    assert said == value


def test_dynamic_imports_are_counted(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "cmds").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cmds" / "__init__.py").write_text(
        "import importlib\ndef load(n):\n    return importlib.import_module(f'pkg.cmds.{n}_cmd')\n")
    (pkg / "cmds" / "run_cmd.py").write_text("def f():\n    from pkg.cmds import load\n")
    (pkg / "cmds" / "other.py").write_text("")
    graph = import_graph(module_names(pkg))
    assert graph["pkg.cmds"] == {"pkg.cmds.run_cmd"}
    assert find_cycle(graph) == ["pkg.cmds", "pkg.cmds.run_cmd", "pkg.cmds"]


def test_function_level_imports_are_counted(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\n"
                              "def f():\n    from . import c\n    return c\n")
    (pkg / "c.py").write_text("def g():\n    import pkg.a\n")
    graph = import_graph(module_names(pkg))
    assert graph["pkg.b"] == {"pkg.c"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("X = 1\n")
    assert find_cycle(import_graph(module_names(pkg))) is None


@pytest.mark.parametrize("module", ["rlmlab.task.expr", "rlmlab.experiments.kinds.base", "rlmlab.experiments.folder",
                                    "rlmlab.experiments.job", "rlmlab.experiments.cluster"])
def test_each_module_imports_first_on_its_own(module):
    # Without cycles any module can be the first one imported, and the task it then loads works.
    import subprocess
    import sys

    code = (f"import {module}\nfrom rlmlab.task.taskfile import load_task\n"
            "task = load_task('paper')\nassert task.evaluate(task.parse('add(square(2),3)')) == 7")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_importing_the_task_package_sets_nothing_up():
    # No module-level state chooses a task: importing the package loads none of its modules, and
    # the expression functions have no library of their own to fall back on.
    import subprocess
    import sys

    code = ("import sys, rlmlab.task\nassert not [m for m in sys.modules if m.startswith('rlmlab.task.')]\n"
            "import rlmlab.task.expr as e\nassert not hasattr(e, 'default_library')\n"
            "try:\n    e.parse('add(2,3)')\nexcept TypeError:\n    pass\nelse:\n    raise SystemExit(1)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
