"""The library's layers, read from the AST: arrows only downward, no import cycles, short modules, and no
module that nothing uses (imports or launches).

course     cli, viz, bench, demos/, grading/, authoring   (may import anything below)
jobs       jobs/ (launch, runtime, cluster, diagnose, monitor)
technique  parallel/, resilience/, nccl/
base       comm/, models, data, perfmodel, i18n, caps, fonts, sandbox/ (stdlib only: see below)

Every import counts, including one inside a function: a function-level import hides the real graph,
it does not change it.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "dtrain_lab"
MAX_LINES = 500

LAYERS = {
    "base": {"comm", "models", "data", "perfmodel", "i18n", "caps", "fonts", "sandbox"},
    "technique": {"parallel", "resilience", "nccl", "planner"},
    "jobs": {"jobs"},
    "course": {"cli", "viz", "viz_plan", "bench", "demos", "grading", "authoring", "figures", "studytime", "selfcheck"},
}
RANK = {"base": 0, "technique": 1, "jobs": 2, "course": 3}


def _top(module: str) -> str | None:
    """dtrain_lab.parallel.zero -> 'parallel'; dtrain_lab -> None (the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "dtrain_lab" else None


def _layer(top: str | None) -> str | None:
    for layer, names in LAYERS.items():
        if top in names:
            return layer
    return None


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path, tree: ast.AST | None = None) -> list[tuple[int, str]]:
    """Every dtrain_lab module ``path`` imports (absolute names), wherever the import stands
    (``tree``: its code already parsed, e.g. a lesson's cell)."""
    tree = tree or ast.parse(path.read_text(encoding="utf-8"))
    me = _module_name(path)
    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "dtrain_lab"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "dtrain_lab":
                continue
            for a in node.names:  # `from dtrain_lab.parallel import zero` imports a module
                sub = f"{mod}.{a.name}"
                out.append((node.lineno, sub if _exists(sub) else mod))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("dtrain_lab"):
                out.append((node.lineno, node.args[0].value))
    return out


def _exists(module: str) -> bool:
    rel = Path(*module.split("."))
    return (ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__init__.py").exists()


def test_layers_only_import_downward():
    bad = []
    for path in _files():
        me = _module_name(path)
        my_layer = _layer(_top(me))
        if my_layer is None:  # the package root re-exports (launch, set_lang): it sits above everything
            continue
        for line, mod in _imports(path):
            top = _top(mod)
            if top is None:
                if my_layer != "course":
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports the package root (which imports jobs)")
                continue
            layer = _layer(top)
            assert layer is not None, f"{mod} (imported by {me}) is in no layer: add it to LAYERS"
            if RANK[layer] > RANK[my_layer]:
                bad.append(f"{path.relative_to(ROOT)}:{line} ({my_layer}) imports {mod} ({layer})")
    assert not bad, "imports that point upward:\n" + "\n".join(bad)


def test_technique_and_base_never_import_jobs_or_course():
    """The rule of the issue, stated on its own: comm/, parallel/, resilience/ and nccl/ run with a
    process group at any world size and never reach for the launcher, runtime, grader or demos."""
    forbidden = LAYERS["jobs"] | LAYERS["course"]
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}"
           for p in _files() if _layer(_top(_module_name(p))) in ("base", "technique")
           for line, mod in _imports(p) if _top(mod) in forbidden]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    for path in _files():
        graph[_module_name(path)] = {m for _, m in _imports(path) if m != _module_name(path)}
    # Tarjan's strongly connected components
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    # a package importing its own submodules (re-exports) and those importing siblings is not a cycle
    # of design, but Python still executes it as one: none allowed.
    assert not sccs, f"import cycles: {sccs}"


def test_no_module_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in _files()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them; tables become data files): {long}"


def test_the_sandbox_package_needs_nothing_but_the_standard_library():
    """dtrain_lab/sandbox/ (starting, containing and isolating processes: the security-relevant code,
    README.md there) runs as ``python -I -S``, before anything else is importable: it imports the
    standard library and itself, nothing else of the course, and torch only where a fork server
    preloads it for the processes it forks."""
    import sys

    stdlib = set(sys.stdlib_module_names)
    bad = []
    for path in sorted((PKG / "sandbox").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for name in names:
                top = name.split(".")[0]
                if name.startswith("dtrain_lab.sandbox") or top in stdlib or top == "__future__":
                    continue
                if top == "torch" and path.name == "supervisor_server.py":
                    continue
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not bad, "\n".join(bad)
    assert (PKG / "sandbox" / "README.md").is_file()


def test_no_module_loads_course_code_by_file_path():
    """Course code is imported as modules, never loaded from a file path (spec_from_file_location,
    run_path), so that the import graph above is the real one. Two files are loaded by path, and are
    not course code loading course code: the file torchrun itself runs in each forked worker
    (``--run-path``), and the learner's submission, which the grading harness loads."""
    allowed = {"jobs/_forked_rank.py": "run_path(", "grading/harness.py": "spec_from_file_location"}
    bad = []
    for path in _files():
        text = path.read_text(encoding="utf-8")
        rel = str(path.relative_to(PKG))
        for word in ("spec_from_file_location", "run_path("):
            if word in text and allowed.get(rel) != word:
                bad.append(f"{path.relative_to(ROOT)}: {word}")
    assert not bad, bad


# ------------------------------------------------------------------------------ no orphan modules
_NAME = re.compile(r"\bdtrain_lab(?:\.\w+)+")
_PATH = re.compile(r"\bdtrain_lab(?:/\w+)+\.py\b")
_RUN = re.compile(r"-m\s+(dtrain_lab(?:\.\w+)*)")        # python -m pkg runs pkg/__main__.py


def _names_in(text: str) -> set[str]:
    """Module names a text holds: dotted names, file paths, and ``pkg.__main__`` for ``-m pkg``."""
    return (set(_NAME.findall(text)) | {p[:-3].replace("/", ".") for p in _PATH.findall(text)}
            | {m + ".__main__" for m in _RUN.findall(text)})


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _code_references(text: str, path: Path, by_file_name: dict[str, str]) -> set[str]:
    """Modules a piece of Python uses: what it imports (wherever the import stands); the module names
    and paths its strings hold (``launch("dtrain_lab.demos.x")``, ``[python, "-m", "dtrain_lab.x"]``);
    a module's file name as a string (``Path(__file__).parent / "flood.py"``: loaded by path, or put on
    ``sys.path`` as ``_inject/sitecustomize.py`` is). Docstrings are left out (a mention is not a use),
    and comments are not in the tree."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith(("%", "!"))]   # notebook magics
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return _names_in(text)
    out = {m for _, m in _imports(path if path.suffix == ".py" else ROOT / "tests" / "cell.py", tree)}
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            out |= _names_in(node.value)
            if node.value in by_file_name:
                out.add(by_file_name[node.value])
        elif isinstance(node, (ast.List, ast.Tuple)):           # [sys.executable, "-m", "dtrain_lab.x"]
            items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            out |= {f"{b}.__main__" for a, b in zip(items, items[1:]) if a == "-m" and isinstance(b, str)}
    return out


def _module_of(name: str) -> str | None:
    """The longest prefix of ``name`` that is a module of the package (a name may end in an attribute)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if _exists(".".join(parts[:n])):
            return ".".join(parts[:n])
    return None


def _referenced() -> dict[str, set[str]]:
    """``{module: files that use it}`` from every place that may use a module: the package itself,
    the tests, tools/, the lessons' and labs' sources (their code cells), the Makefile,
    pyproject.toml (entry points), tools' scripts and .ci/. A module's uses of itself do not count."""
    from dtrain_lab import authoring

    names = [p.name for p in _files()]
    by_file_name = {p.name: _module_name(p) for p in _files() if names.count(p.name) == 1}
    sources: list[tuple[Path, str, bool]] = []   # (path, text, Python?)
    for folder in (PKG, ROOT / "tests", ROOT / "tools"):
        sources += [(p, p.read_text(encoding="utf-8"), True) for p in sorted(folder.rglob("*.py"))
                    if "__pycache__" not in p.parts]
    for folder in ("lessons/_source", "solutions/_source"):
        for path in sorted((ROOT / folder).glob("*.md")):
            sources += [(path, cell.text.get("*", ""), True)
                        for cell in authoring.parse(path.read_text(encoding="utf-8"), str(path))
                        if cell.kind in ("code", "setup")]
    for path in [ROOT / "Makefile", ROOT / "pyproject.toml", *sorted((ROOT / "tools").glob("*.sh")),
                 *sorted((ROOT / ".ci").glob("*"))]:
        if path.is_file():
            sources.append((path, path.read_text(encoding="utf-8"), False))
    used: dict[str, set[str]] = {}
    for path, text, python in sources:
        me = _module_name(path) if path.is_relative_to(PKG) else None
        for name in (_code_references(text, path, by_file_name) if python else _names_in(text)):
            mod = _module_of(name)
            while mod and mod != me:       # a use of a.b.c imports a and a.b as well
                used.setdefault(mod, set()).add(str(path.relative_to(ROOT)))
                mod = mod.rpartition(".")[0] if "." in mod else None
    return used


def test_every_module_is_used_somewhere():
    """Every module under dtrain_lab/ is imported or launched by something: another module, a test,
    a tool, a lesson's or lab's code, the Makefile, an entry point. A module nothing uses is dead
    code the course still has to keep correct (``demos/collective_timing`` was one)."""
    used = _referenced()
    orphans = [_module_name(p) for p in _files() if _module_name(p) not in used]
    assert not orphans, f"modules nothing imports or launches (delete them, or use them): {orphans}"
