"""The import graph of the package: no cycles, and dependencies that point one way.

Every ``import`` of ``lazytensor/``, ``codegen/`` and ``cache/`` counts, at module level and
inside functions alike (parsed with ``ast``, nothing is imported). ``codegen``
(``lazytensor.codegen``) and ``cache`` (``lazytensor.cache``) import neither the rest of
``lazytensor`` nor each other; ``lazytensor`` is where they meet.

Inside ``lazytensor/``, folders are layers (``LAYERS``, lowest first): a module imports
only modules of its own layer or of the layers below it, and the backends' folders
import none of each other. At most ``MAX_TOP_MODULES`` modules sit directly in
``lazytensor/``; every folder there has its layer.

Only the CPU backend (``codegen/cpu``, ``lazytensor/backends/cpu``) imports
``lazytensor.codegen.cpu``: the shared passes take a backend's tuning as an argument.

Imports by name (``importlib.import_module(".x", __package__)``) are edges too, kept
apart as *late* edges: each must be listed in ``LATE_EDGES`` with its reason, so a new
one (a cycle hidden from the graph, or an edge up the layers) fails the test until it is
justified.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"lazytensor": ROOT / "lazytensor", "lazytensor.codegen": ROOT / "codegen",
            "lazytensor.cache": ROOT / "cache"}


# The layers of lazytensor/, lowest first: folders (and the modules directly in
# lazytensor/ that belong to a layer); "" is the package's own __init__.
LAYERS = (
    ("", "errors", "lazy_exports", "forks"),  # the public names (loaded by name on first use),
    # errors, the fork-safety record
    ("core",),  # binding, options, the call, kernels and the backend protocol
    ("backends",),  # one folder per backend: cpu, cuda, reference
    ("autodiff",),  # autograd, dual numbers, torch.func rules
    ("engine",),  # plans: prepare once, run per call
    ("scale", "distributed", "dask", "fastsum"),  # ranges, blocks and merges; process groups,
    # Dask; sums to a tolerance (truncation, spectral, split: block-sparse and NUFFT)
    ("api",),  # LazyTensor, Genred, solve, user functions
    ("interop",),  # NumPy's and torch's protocols
    ("integrations", "compat"),  # the torch.library op, the pykeops alias
    ("cli",),  # python -m lazytensor
    ("numpy", "torch", "cuda", "__main__"),  # pykeops-style entry points, the CUDA helpers
)
MAX_TOP_MODULES = 15

# late edges (module loads module by name on first use): why each is there
LATE_EDGES = {
    ("lazytensor.api.lazy", "lazytensor.interop.protocols"):
        "interop's rules subclass LazyTensor: lazy names interop instead of importing it",
    ("lazytensor.engine.plans", "lazytensor.integrations.torch_library"):
        "the torch.library op runs plans and LazyTensor's interop table: the engine, LazyTensor "
        "and Genred reach it through engine.torch_library() under torch.compile/export",
    ("lazytensor.core.backend", "lazytensor.backends"):
        "the registry finds the backends by their folders: calls ask it for a backend by name",
}


def _modules() -> dict:
    """module name -> (path, is a package)."""
    out = {}
    for base, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            out[".".join([base, *parts])] = (path, is_pkg)
    return out


def _resolve(name: str, modules: dict):
    """The innermost of our modules that ``name`` (a dotted module path) falls in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _by_name(node: ast.AST, name: str, package: str) -> str | None:
    """The module an ``importlib.import_module(...)`` call names, when it is spelled with
    constants, ``__package__`` and ``__name__`` only (else None)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module" and node.args):
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        if not arg.value.startswith("."):
            return arg.value
        if len(node.args) < 2 or not (isinstance(node.args[1], ast.Name)
                                      and node.args[1].id == "__package__"):
            return None
        level = len(arg.value) - len(arg.value.lstrip("."))
        base = package
        for _ in range(level - 1):
            base = base.rpartition(".")[0]
        return f"{base}.{arg.value[level:]}" if arg.value[level:] else base
    if not isinstance(arg, ast.JoinedStr):
        return None
    text = []
    for part in arg.values:
        if isinstance(part, ast.Constant):
            text.append(str(part.value))
        elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) \
                and part.value.id in ("__package__", "__name__"):
            text.append(package if part.value.id == "__package__" else name)
        else:
            return None
    return "".join(text)


def late_edges() -> set:
    """(module, module it imports by name), for names spelled with constants."""
    modules = _modules()
    out = set()
    for name, (path, is_pkg) in modules.items():
        package = name if is_pkg else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            target = _by_name(node, name, package)
            found = _resolve(target, modules) if target else None
            if found is not None and found != name:
                out.add((name, found))
    return out


def import_graph() -> dict:
    """module -> set of our modules it imports (anywhere in its code)."""
    modules = _modules()
    graph = {}
    for name, (path, is_pkg) in modules.items():
        package = name if is_pkg else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                # `from pkg import sub` imports the submodule pkg.sub when there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            for t in targets:
                found = _resolve(t, modules)
                if found is not None and found != name:
                    edges.add(found)
        graph[name] = edges
    return graph


def _cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_graph_sees_the_imports():
    graph = import_graph()
    assert "lazytensor.codegen.ops" in graph["lazytensor.codegen.elementwise"]
    assert "lazytensor.codegen.cpu.plan" in graph["lazytensor.codegen.cpu.kernel"]
    assert "lazytensor.codegen.reductions.base" in graph["lazytensor.codegen.reductions.lse"]
    assert "lazytensor.cache" in graph["lazytensor.core.kernels"]  # a function-level import
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_codegen_and_cache_import_neither_lazytensor_nor_each_other():
    bad = []
    for name, edges in import_graph().items():
        for own, others in (("lazytensor.codegen", ("lazytensor.cache",)),
                            ("lazytensor.cache", ("lazytensor.codegen",))):
            if not _inside(name, own):
                continue
            for e in edges:
                if not _inside(e, own) or any(_inside(e, o) for o in others):
                    bad.append(f"{name} imports {e}")
    assert not bad, bad


def test_only_the_cpu_backend_imports_the_cpu_code_generator():
    """The shared passes take a backend's tuning as an argument (codegen.tuning): outside
    the CPU backend (its code generator, its runtime) nothing imports codegen.cpu."""
    own = ("lazytensor.codegen.cpu", "lazytensor.backends.cpu")
    graph = import_graph()
    bad = [f"{name} imports {e}" for name, edges in graph.items()
           if not any(_inside(name, o) for o in own)
           for e in edges if _inside(e, "lazytensor.codegen.cpu")]
    assert not bad, bad
    assert "lazytensor.codegen.cpu" in graph["lazytensor.backends.cpu.runtime"]  # seen


def test_imports_by_name_are_the_listed_late_edges():
    found = late_edges()
    assert found == set(LATE_EDGES), (
        f"imports by name not listed in LATE_EDGES: {sorted(found - set(LATE_EDGES))}; "
        f"listed but gone: {sorted(set(LATE_EDGES) - found)}")
    # a late edge is there to break a cycle or to reach up the layers: as a plain import
    # it would close a cycle, or point upward
    graph = import_graph()
    for a, b in found:
        upward = (_layer(a) or 0) < (_layer(b) or 0)
        assert upward or _cycles({**graph, a: graph[a] | {b}}), f"{a} -> {b} can be a plain import"


def _layer(name: str) -> int | None:
    """The layer of a module of lazytensor/ (None: codegen, cache, or not in a layer)."""
    if _inside(name, "lazytensor.codegen") or _inside(name, "lazytensor.cache"):
        return None
    head = name.split(".")[1] if "." in name else ""
    for k, members in enumerate(LAYERS):
        if head in members:
            return k
    raise AssertionError(f"{name}: lazytensor/{head} is in no layer of LAYERS")


def test_layers_are_imported_downward_only():
    late = set(LATE_EDGES)
    bad = []
    for name, edges in import_graph().items():
        own = _layer(name)
        if own is None:
            continue
        for e in edges:
            up = _layer(e)
            if up is not None and up > own and (name, e) not in late:
                bad.append(f"{name} (layer {LAYERS[own][0] or 'lazytensor'}) imports {e} "
                           f"(layer {LAYERS[up][0]})")
    assert not bad, bad


def test_backends_do_not_import_each_other():
    bad = []
    for name, edges in import_graph().items():
        if not _inside(name, "lazytensor.backends") or name == "lazytensor.backends":
            continue
        folder = ".".join(name.split(".")[:3])
        for e in edges:
            if _inside(e, "lazytensor.backends") and e != "lazytensor.backends" \
                    and not _inside(e, folder):
                bad.append(f"{name} imports {e}")
    assert not bad, bad


def test_every_folder_has_its_layer_and_few_modules_sit_at_the_top():
    root = PACKAGES["lazytensor"]
    names = {m for layer in LAYERS for m in layer}
    folders = [p.name for p in root.iterdir() if (p / "__init__.py").exists()]
    assert sorted(f for f in folders if f not in names) == []
    top = [p.stem for p in root.glob("*.py") if p.stem != "__init__"]
    assert len(top) <= MAX_TOP_MODULES, sorted(top)


def test_pyproject_installs_every_package():
    """A folder missing from pyproject's ``packages`` would be absent from a wheel (the
    editable install used by the tests finds it anyway)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {name for name, (_, is_pkg) in _modules().items() if is_pkg}
    assert sorted(found - listed) == [] and sorted(listed - found) == []
