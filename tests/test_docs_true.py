"""The docs say only what the tree holds: what a test can check mechanically.

1. Every repository path a doc names (``gtopk_lab/...``, ``tests/...``, ``benchmarks/...``,
   ``notebooks/...``, ``docs/...``, ``cluster/...``) exists (a ``*`` in it is a glob).
2. Every dotted name ``gtopk_lab.a.b[.attr]`` a doc names is a module that exists, or an
   attribute of one (found in its source by ``ast``, so no module is imported).
3. Every ``def name(...)`` quoted in a doc's code block has the parameters, in order, of a
   function or method of that name in the package: in docs/architecture.md (the contracts)
   every quoted def; elsewhere the ones the package defines (docs/extending.md also shows a
   user's own functions).

The docs checked are README.md, docs/*.md, cluster/README.md and the current figures of
benchmarks/RESULTS.md (its History records what was true when it was written).
"""

from __future__ import annotations

import ast
import functools
import glob
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gtopk_lab"


def _docs() -> dict[str, str]:
    files = [ROOT / "README.md", ROOT / "cluster" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    out = {str(p.relative_to(ROOT)): p.read_text() for p in files}
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    out["benchmarks/RESULTS.md"] = re.split(r"^#+ *History", results, maxsplit=1, flags=re.M)[0]
    return out


DOCS = _docs()
PATH_RE = re.compile(r"(?<![\w./-])((?:gtopk_lab|tests|benchmarks|notebooks|docs|cluster)/[\w./*-]*[\w*])")
NAME_RE = re.compile(r"(?<![\w.])(gtopk_lab(?:\.\w+)+)")
DEF_RE = re.compile(r"^\s*def (\w+)\((.*?)\)\s*(?:->[^:]*)?:?\s*$", re.M | re.S)


def _paths() -> list[tuple[str, str]]:
    found = set()
    for doc, text in DOCS.items():
        for m in PATH_RE.finditer(text):
            path = m.group(1).rstrip(".")
            if re.match(r"[-_.]?\{", text[m.end():m.end() + 2]):  # a brace list of names: a prefix of them
                path += "*"
            found.add((doc, path))
    return sorted(found)


def _names() -> list[tuple[str, str]]:
    return sorted({(doc, m.group(1).rstrip(".")) for doc, text in DOCS.items() for m in NAME_RE.finditer(text)})


@pytest.mark.parametrize("doc,path", _paths())
def test_every_path_a_doc_names_exists(doc: str, path: str) -> None:
    if _generated(path):
        return
    if "*" in path:
        assert glob.glob(str(ROOT / path)), f"{doc} names {path}, which matches nothing"
    else:
        assert (ROOT / path).exists(), f"{doc} names {path}, which does not exist"


def _generated(path: str) -> bool:
    """A path a command writes (cluster/certs by make_certs.py): ignored by a .gitignore beside it."""
    parts = path.split("/")
    for depth in range(1, len(parts)):
        ignore = ROOT.joinpath(*parts[:depth], ".gitignore")
        if ignore.exists() and any(line.strip().rstrip("/") == parts[depth]
                                   for line in ignore.read_text().splitlines()):
            return True
    return False


@functools.cache
def _module_names(path: Path) -> frozenset[str]:
    """Names a module binds at its top level or in its classes (defs, classes, assignments, imports)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.ClassDef):
                names.add(node.name)
                visit(node.body)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                for extra in getattr(node, "orelse", []), *[h.body for h in getattr(node, "handlers", [])]:
                    visit(extra)

    visit(tree.body)
    return frozenset(names)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:split])
        module = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        if not module.exists():
            continue
        rest = parts[split:]
        if not rest:
            return True
        if rest[0] in _module_names(module):
            return True
        # a submodule of a package
        return (base / f"{rest[0]}.py").exists() or (base / rest[0] / "__init__.py").exists()
    return False


@pytest.mark.parametrize("doc,name", _names())
def test_every_package_name_a_doc_names_exists(doc: str, name: str) -> None:
    assert _resolves(name), f"{doc} names {name}, which is no module or attribute of gtopk_lab"


@functools.cache
def _signatures() -> dict[str, list[list[str]]]:
    out: dict[str, list[list[str]]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                params += [f"*{a.vararg.arg}"] if a.vararg else []
                params += [f"**{a.kwarg.arg}"] if a.kwarg else []
                out.setdefault(node.name, []).append([p for p in params if p not in ("self", "cls")])
    return out


def _quoted_defs() -> list[tuple[str, str, list[str]]]:
    found = []
    for doc, text in DOCS.items():
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
            for m in DEF_RE.finditer(block):
                params = []
                for raw in re.split(r",(?![^\[\(]*[\]\)])", m.group(2)):
                    raw = raw.strip()
                    if not raw or raw in ("*", "/", "self", "cls") or raw.startswith("..."):
                        continue
                    stars = "**" if raw.startswith("**") else "*" if raw.startswith("*") else ""
                    params.append(stars + re.split(r"[:=]", raw.lstrip("*"))[0].strip())
                found.append((doc, m.group(1), params))
    return found


@pytest.mark.parametrize("doc,name,params", _quoted_defs())
def test_every_quoted_signature_matches_the_code(doc: str, name: str, params: list[str]) -> None:
    candidates = _signatures().get(name, [])
    if not candidates and doc != "docs/architecture.md":
        pytest.skip(f"{name} is a user's example in {doc}")
    assert candidates, f"{doc} quotes def {name}(...), which the package does not define"
    assert params in candidates, (f"{doc} quotes def {name}({', '.join(params)}); the package has "
                                  + "; ".join(f"({', '.join(c)})" for c in candidates))


def _module_map_entries() -> list[str]:
    """Paths of architecture.md's module map (a tree: two spaces per level, names first)."""
    text = DOCS["docs/architecture.md"]
    block = re.search(r"## Module map\s*```\n(.*?)```", text, flags=re.S).group(1)
    stack: list[str] = []
    out = []
    for line in block.splitlines():
        m = re.match(r"^( *)(\S.*?)(?: {2,}|$)", line)
        if not m or len(m.group(1)) >= 20:  # a description's continuation
            continue
        level = len(m.group(1)) // 2
        for name in (t.strip() for t in m.group(2).split(",")):
            if not re.fullmatch(r"[\w.]+(/|\.py)", name):
                continue
            path = "/".join([*stack[:level], name.rstrip("/")])
            out.append(path)
            if name.endswith("/"):
                stack[level:] = [name.rstrip("/")]
    return out


@pytest.mark.parametrize("path", _module_map_entries())
def test_every_module_of_the_module_map_exists(path: str) -> None:
    assert (ROOT / path).exists(), f"docs/architecture.md's module map names {path}, which does not exist"


def test_the_module_map_lists_every_module_of_the_package() -> None:
    listed = set(_module_map_entries())
    prose = DOCS["docs/architecture.md"]
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in listed or path.name == "__init__.py" or rel.split("/")[-2] in ("cli", "bench", "plotting"):
            continue
        if path.name not in prose and path.stem not in prose:
            missing.append(rel)
    assert not missing, f"docs/architecture.md never mentions these modules: {missing}"


def test_results_current_figures_are_short_and_each_table_names_its_machine_and_commit() -> None:
    """benchmarks/RESULTS.md opens with at most 150 lines of current figures; every section
    there names the machine it ran on and a commit (ratios differ between CPUs)."""
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    before_history = text.split("\n## History", 1)[0]  # the page a reader sees first, intro included
    assert len(before_history.splitlines()) <= 150, f"current figures run {len(before_history.splitlines())} lines"
    current = before_history.split("\n## Current figures\n", 1)[1]
    sections = re.split(r"^### ", current, flags=re.M)[1:]
    assert sections, "no sections under Current figures"
    for section in sections:
        title = section.splitlines()[0]
        assert re.search(r"2-core box|host|Xeon|EPYC", section), f"{title!r} names no machine"
        assert re.search(r"commit|\b[0-9a-f]{7}\b", section), f"{title!r} names no commit"
