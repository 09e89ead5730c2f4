"""The house plan, checked on the source (AST, nothing imported): the import graph of planning/,
kernels/, partui/ and tests/ has no cycle; planning/ imports only the standard library and itself
(no torch, no kernels, no partui); kernels/ imports only the standard library, torch (numpy too),
planning and itself; no module takes another module's underscore name; intra-project imports in
kernels/ and partui/ sit at module top level (the exceptions are listed below, each with its
reason); and no source file in kernels/ or partui/ is over 300 lines unless
docs/architecture.md names it with a reason.

Imports inside functions count (they are edges all the same); imports under
`if TYPE_CHECKING:` do not (they never run). That only kernels/comm/ imports torch.distributed
is checked by tests/kernels/test_comm.py::test_only_comm_imports_torch_distributed.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("planning", "kernels", "partui")
MAX_LINES = 300
ARCHITECTURE = ROOT / "docs" / "architecture.md"
KERNELS_MAY_IMPORT = {"kernels", "planning", "torch", "numpy"} | set(sys.stdlib_module_names)
PLANNING_MAY_IMPORT = {"planning"} | set(sys.stdlib_module_names)

# (file, module it imports inside a function) -> why that import cannot sit at the top
LOCAL_IMPORTS_ALLOWED = {
    ("partui/app/screens/trace_actions.py", "partui.analysis"):
        "the analysis brings pandas (~0.5 s): loaded on the first trace report, not before the "
        "app's first frame (partui bench app: target 1.5 s)",
    ("partui/app/screens/mesh.py", "partui.world.layout"):
        "the layout builds each rank's engine (torch), which the app loads after its first frame",
    ("partui/world/world_trace.py", "partui.analysis"):
        "the analysis imports pandas; the app loads it on its first report, not at start",
    ("partui/world/world.py", "partui.world.checker"):
        "the single-process reference imports torch; only a checked world needs it",
    ("partui/commands/plan.py", "partui.world.layout"):
        "the layout builds each rank's engine (torch, ~3 s): a refused plan answers before it loads",
    ("partui/commands/plan.py", "partui.analysis.table.events"):
        "the analysis imports pandas: `plan --trace` reads a trace, a plain `plan` never does",
    ("partui/commands/plan.py", "partui.analysis.figures.memory"):
        "the analysis imports pandas: `plan --trace` reads a trace, a plain `plan` never does",
    ("partui/commands/run.py", "kernels.comm"):
        "torch (~3 s): a refused `partui run` answers before it loads",
    ("partui/commands/run.py", "partui.world.torchrun"):
        "torch (~3 s): a refused `partui run` answers before it loads",
    ("partui/commands/run.py", "partui.analysis.replay.blame_marks"):
        "pandas and torch: only `--critical-path` marks a trace, after the run",
    ("partui/app/screens/commands.py", "partui.checkpoints.reshard_map"):
        "the reshard map builds each rank's engine (torch): the app loads it on its first map",
    ("partui/commands/plan.py", "partui.checkpoints.reshard_map"):
        "the reshard map builds each rank's engine (torch): a refused plan answers before it loads",
    ("partui/checkpoints/checkpoint.py", "kernels.comm"):
        "DCP's index needs torch: read only after the torch-free checks pass (World stays light)",
    ("partui/world/worker.py", "partui.world.rank"):
        "rank-only code (torch, the engine), preloaded by the fork server, not the controller",
    ("partui/commands/report.py", "partui.commands.report_frames"):
        "the analysis table imports pandas (~0.5 s): a GPU trace by rank is reported without it "
        "(report_lean), everything else loads it then (issue 36: report / HTA <= 0.25)",
    ("partui/commands/report.py", "partui.commands.report_vs"):
        "`compare` for Python callers reads frames (pandas): loaded on first use, not by `partui report`",
    ("partui/world/tables.py", "partui.analysis.figures.definitions"):
        "the analysis package imports pandas; the definitions ride along only in to_pandas()",
    ("partui/analysis/reading/column_parts.py", "partui.analysis.table.events"):
        "events builds frames (pandas): the streamed read's parts are numpy; only a frame's categorical needs it",
    ("partui/analysis/reading/columns.py", "partui.analysis.table.events"):
        "events builds frames (pandas): Columns.frame alone needs it; the lean reports read columns without it",
    ("partui/analysis/figures/pair_plan.py", "partui.analysis.figures.kineto_pairs"):
        "the analysis table (pandas) only for a trace the pandas-free reader leaves (simulate --parts)",
    ("partui/analysis/figures/pair_plan.py", "partui.analysis.reading.reader"):
        "the analysis table (pandas) only for a trace the pandas-free reader leaves (simulate --parts)",
}


# ---------------------------------------------------------------- the graph

@dataclass(frozen=True)
class Import:
    path: str                # the importing file, relative to ROOT
    line: int
    module: str              # the module named, absolute (`from . import x` resolved)
    names: tuple[str, ...]   # `from module import names`; () for `import module`
    in_function: bool

    def __str__(self) -> str:
        return f"from {self.module} import {', '.join(self.names)}" if self.names \
            else f"import {self.module}"


def source_files() -> list[Path]:
    return sorted(p for top in (*PACKAGES, "tests") for p in (ROOT / top).rglob("*.py"))


def module_name(path: Path) -> str:
    """kernels/comm/core.py -> kernels.comm.core; kernels/comm/__init__.py -> kernels.comm.
    tests/ and its rooms are on sys.path, so a test module is its file name (conftest, worlds)."""
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "tests":
        return rel.stem
    parts = rel.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path) -> list[Import]:
    """Every import statement of a file, function-level ones included, TYPE_CHECKING ones not."""
    rel = path.relative_to(ROOT).as_posix()
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                visit(child, in_function)
            return
        if isinstance(node, ast.Import):
            out.extend(Import(rel, node.lineno, a.name, (), in_function) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:                          # relative: the package, level - 1 up
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{module}" if module else base
            out.append(Import(rel, node.lineno, module, tuple(a.name for a in node.names),
                              in_function))
        in_function = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, in_function)

    visit(ast.parse(path.read_text(), str(path)), False)
    return out


def targets(imp: Import, modules: set[str]) -> set[str]:
    """The project modules an import loads: `from a import b` is a.b when that is a module."""
    if not imp.names:
        return {imp.module} & modules
    subs = {f"{imp.module}.{n}" for n in imp.names} & modules
    if len(subs) < len(imp.names) and imp.module in modules:
        subs.add(imp.module)
    return subs


def build() -> tuple[dict[str, list[Import]], dict[str, set[str]]]:
    """({module: its imports}, {module: the project modules it imports})."""
    by_module = {module_name(p): imports(p) for p in source_files()}
    modules = set(by_module)
    graph = {m: {t for imp in imps for t in targets(imp, modules)} - {m}
             for m, imps in by_module.items()}
    return by_module, graph


# ---------------------------------------------------------------- cycles

def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Modules reachable from start by one import or more."""
    seen, todo = set(), list(graph.get(start, ()))
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def shortest_loop(graph: dict[str, set[str]], start: str) -> list[str]:
    """start -> ... -> start with the fewest imports (breadth first); [] when there is none."""
    came_from, todo = {start: None}, deque([start])
    while todo:
        m = todo.popleft()
        for n in sorted(graph.get(m, ())):
            if n == start:
                path = [m]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if n not in came_from:
                came_from[n] = m
                todo.append(n)
    return []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One loop per knot (a set of modules that all reach each other), as a readable path."""
    out, done = [], set()
    for m in sorted(graph):
        if m in done or m not in reach(graph, m):
            continue
        done |= {n for n in reach(graph, m) if m in reach(graph, n)}
        out.append(shortest_loop(graph, m))
    return out


def test_cycle_finder_on_a_known_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"},
             "g": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_graph_sees_function_level_imports_and_skips_type_checking(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "partui").mkdir()
    src = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import partui.b\n"
           "def f():\n    from . import c\n")
    (tmp_path / "partui" / "a.py").write_text(src)
    got = imports(tmp_path / "partui" / "a.py")
    assert [(i.module, i.names, i.in_function) for i in got] == [
        ("typing", ("TYPE_CHECKING",), False), ("partui", ("c",), True)]


# ---------------------------------------------------------------- the rules

def test_no_import_cycle():
    _, graph = build()
    loops = cycles(graph)
    assert not loops, "import cycles (break each by moving what both sides need into a module " \
                      "both import):\n" + "\n".join(" -> ".join(c) for c in loops)


def imports_outside(package: str, allowed: set[str]) -> list[str]:
    """Every import of a module of `package` whose top-level name is not in `allowed`."""
    by_module, _ = build()
    return [f"{i.path}:{i.line}: {i}" for m, imps in by_module.items()
            if m.split(".")[0] == package for i in imps if i.module.split(".")[0] not in allowed]


def test_kernels_import_only_stdlib_and_torch():
    bad = imports_outside("kernels", KERNELS_MAY_IMPORT)
    assert not bad, "kernels/ is the algorithms: it imports nothing from partui, textual, " \
                    "pandas, viztracer, ...:\n" + "\n".join(bad)


def test_planning_imports_only_stdlib_and_itself():
    """planning/ is the torch-free room: not torch, not kernels (whose packages load torch), not
    partui, pandas or textual; what it imports it can be asked about on paper."""
    bad = imports_outside("planning", PLANNING_MAY_IMPORT)
    assert not bad, "planning/ is torch-free planning maths: it imports only the standard " \
                    "library and itself:\n" + "\n".join(bad)


def test_planning_loads_without_torch():
    """Every planning module imported in a fresh interpreter leaves torch unloaded."""
    names = sorted(module_name(p) for p in (ROOT / "planning").rglob("*.py"))
    code = ("import importlib, sys\n" + "".join(f"importlib.import_module({n!r})\n" for n in names)
            + "print(sorted(m for m in ('torch', 'kernels', 'partui', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return base and f"{base}.{node.attr}"
    return None


def underscore_uses(path: Path, imps: list[Import], modules: set[str]) -> list[str]:
    """`from mod import _name`, and `mod._name` where an import of this file bound mod to a
    project module (`import kernels.engine`, `from kernels import comm`)."""
    rel = path.relative_to(ROOT).as_posix()
    bad = [f"{rel}:{i.line}: {i}" for i in imps
           if i.module in modules and any(map(private, i.names))]
    bound = {}
    for i in imps:
        bound.update({n: f"{i.module}.{n}" for n in i.names} if i.names
                     else {i.module.split(".")[0]: i.module.split(".")[0]})
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and private(node.attr):
            head, _, rest = (dotted(node.value) or "").partition(".")
            if head in bound and ".".join(filter(None, [bound[head], rest])) in modules:
                bad.append(f"{rel}:{node.lineno}: {dotted(node)}")
    return bad


def test_underscore_finder_on_a_known_file(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "partui").mkdir()
    f = tmp_path / "partui" / "a.py"
    f.write_text("import partui.b\nfrom partui import c\nfrom partui.b import _x, y\n"
                 "partui.b._z, c._w, c.__name__, y._ok, self._fine\n")
    modules = {"partui", "partui.a", "partui.b", "partui.c"}
    assert underscore_uses(f, imports(f), modules) == [
        "partui/a.py:3: from partui.b import _x, y", "partui/a.py:4: partui.b._z",
        "partui/a.py:4: c._w"]


def test_no_module_takes_another_modules_underscore_name():
    by_module, _ = build()
    bad = [u for p in source_files() for u in underscore_uses(p, by_module[module_name(p)],
                                                              set(by_module))]
    assert not bad, "underscore names are their module's own: make the name public or move " \
                    "the code:\n" + "\n".join(bad)


def test_intra_project_imports_sit_at_the_top():
    by_module, _ = build()
    bad, used = [], set()
    for m, imps in by_module.items():
        if m.split(".")[0] not in PACKAGES:
            continue
        for i in imps:
            if i.in_function and i.module.split(".")[0] in PACKAGES:
                if (i.path, i.module) in LOCAL_IMPORTS_ALLOWED:
                    used.add((i.path, i.module))
                else:
                    bad.append(f"{i.path}:{i.line}: {i}")
    bad += [f"{path}: {module}: listed in LOCAL_IMPORTS_ALLOWED, but no such import is left"
            for path, module in sorted(set(LOCAL_IMPORTS_ALLOWED) - used)]
    assert not bad, "import project modules at the top of the file (or list the exception " \
                    "in LOCAL_IMPORTS_ALLOWED with its reason):\n" + "\n".join(bad)


def test_long_files_are_named_in_the_architecture():
    doc = ARCHITECTURE.read_text().splitlines() if ARCHITECTURE.exists() else []
    bad = []
    for path in source_files():
        rel = path.relative_to(ROOT).as_posix()
        n = len(path.read_text().splitlines())
        if rel.split("/")[0] in PACKAGES and n > MAX_LINES:
            # a line that names the file and says something more: its reason
            if not any(rel in ln and len(ln.replace(rel, "").strip(" -*`|:#")) >= 10 for ln in doc):
                bad.append(f"{rel}: {n} lines")
    assert not bad, (f"source files over {MAX_LINES} lines: split them, or name each in "
                     f"docs/architecture.md with the reason it stays whole"
                     f"{'' if doc else ' (the file does not exist yet)'}:\n" + "\n".join(bad))


def test_architecture_links_stay_inside_the_repository():
    """The map must read in a fresh clone: every relative link or path it cites resolves there."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    outside = sorted(set(re.findall(r"\.\./[\w./-]+", text)))
    assert not outside, f"docs/architecture.md points outside the repository: {outside}"
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if "://" not in target:
            assert (ARCHITECTURE.parent / target).exists(), f"dead link in docs/architecture.md: {target}"


def test_a_plan_validates_without_loading_torch():
    """`partui plan` refuses a bad plan before torch loads (it costs seconds): the plan builder, the
    validator and every torch-free kernels module they reach must keep torch out."""
    code = ("import sys\nfrom partui.world.plans import build_plan\nfrom planning.mesh import PlanError\n"
            "try:\n    build_plan('custom', 'tiny', tp=100000)\nexcept PlanError as e:\n    print(e)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    message, loaded = out.stdout.strip().splitlines()
    assert "pick tp in 1, 2, 4" in message
    assert loaded == "False", "building / refusing a plan imported torch"


@pytest.mark.parametrize("argv,words", [
    (["run", "--world", "-1"], "pick world in"),
    (["run", "--steps", "0"], "try --steps 5"),
    (["run", "--profile", "/proc/partui-no/prof"], "pick a folder you can write"),
])
def test_a_refused_run_answers_without_loading_torch(argv, words):
    """`partui run` with a bad flag answers before torch loads (3 s here), not after."""
    code = ("import sys\nfrom partui.cli import main\nrc = main(sys.argv[1:])\n"
            "print(rc, 'torch' in sys.modules, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert words in out.stderr, out.stderr
    assert out.stdout.split() == ["2", "False", "False"], (out.stdout, out.stderr[-1000:])
