"""The house's import rules, read from the source: every import runs downhill (validation, checksum <- ops,
parallel, data <- nn <- train <- the face: load, export, hf, generation, serve <- eval, the lm-eval adapter), serving
and generation import nothing of the trainer, no module of `retention` imports itself back through others (at the
top or inside a function), the ops are siblings on one floor (no op folder imports another's), the Pallas kernels
import nothing of `retention` and are reached only through the ops' pallas.py files (power retention's, GLA's, GDN's),
experiments/ runs downhill too (its helpers <- the benchmarks <- compare/ <- the scripts built on the comparison),
`import retention.ops` loads neither the trainer's libraries nor Flax, `import retention` neither lm-eval nor torch,
serving and generation load none of the trainer's libraries, and a missing trainer library names the `train` extra."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = {
    "retention.validation": 0,
    "retention.checksum": 0,
    "retention.ops": 1,
    "retention.parallel": 1,
    "retention.data": 1,
    "retention.nn": 2,
    "retention.train": 3,
    "retention.load": 4,
    "retention.hf": 4,
    "retention.export": 4,
    "retention.generation": 4,
    "retention.serve": 4,
    "retention.eval": 5,
}
KERNELS_IMPORTERS = [
    "retention/ops/gated_delta_rule/pallas.py",
    "retention/ops/gated_linear_attention/pallas.py",
    "retention/ops/power_retention/pallas.py",
]
# (importer, imported): packages of the same or a lower layer that the importer still never imports
APART = (("retention.serve", "retention.train"), ("retention.generation", "retention.train"))
# The ops are siblings on one floor: an op folder (a package under retention/ops/) imports no other op folder, the
# floor (the modules beside them: decay.py, chunking.py, validation.py, segments.py, ...) imports no op folder, and
# matrix_state.py, the floor the matrix-state ops share, is imported by no other op.
MATRIX_STATE = "retention.ops.matrix_state"
MATRIX_STATE_OPS = (
    "retention.ops.linear_attention",
    "retention.ops.gated_linear_attention",
    "retention.ops.gated_delta_rule",
)


def _layer(module: str) -> int | None:
    """The layer of a dotted module name under retention (None outside it, or the package face itself)."""
    parts = module.split(".")
    for n in (2, 1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    return None


def _imports(path: pathlib.Path) -> list[str]:
    """The absolute module names a source file imports."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _sources(folder: str):
    return sorted((ROOT / folder).rglob("*.py"))


def _module(path: pathlib.Path) -> str:
    """The dotted module name of a source file under ROOT (a package's `__init__` is the package)."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _edges(source: str, modules) -> set[str]:
    """The `modules` a source imports, by every import statement in it, at the top or inside a function (`from
    package import submodule` is an edge to the submodule)."""
    edges = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            edges |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            edges |= {name if name in modules else node.module for name in names}
    return edges & set(modules)


def _module_graph() -> dict[str, set[str]]:
    """{retention module: the other retention modules it imports}."""
    modules = {_module(path): path for path in _sources("retention")}
    return {name: _edges(path.read_text(), modules) - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for other in edges:
                if other not in index:
                    index[other] = low[other] = len(index)
                    stack.append(other)
                    on_stack.add(other)
                    work.append((other, iter(sorted(graph[other]))))
                    break
                if other in on_stack:
                    low[node] = min(low[node], index[other])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while not component or component[-1] != node:
                        component.append(stack.pop())
                        on_stack.discard(component[-1])
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_imports_run_downhill():
    uphill = []
    for path in _sources("retention"):
        module = _module(path)
        own = _layer(module)
        if own is None:
            continue
        for name in _imports(path):
            other = _layer(name)
            if other is not None and other > own:
                uphill.append(f"{module} imports {name}")
    assert not uphill, uphill


def _crossings(apart, graph: dict[str, set[str]]) -> list[str]:
    """The imports of `graph` from a module within an importer to one within its imported, for (importer,
    imported) in `apart`."""
    return [
        f"{module} imports {name}"
        for module, imports in graph.items()
        for importer, imported in apart
        if _within(module, importer)
        for name in imports
        if _within(name, imported)
    ]


def test_serving_and_generation_never_import_the_trainer():
    crossing = _crossings(APART, _module_graph())
    assert not crossing, crossing


def _ops_apart() -> list[tuple[str, str]]:
    """(importer, imported) pairs of the ops' sibling rule (MATRIX_STATE above): op folder -> another op folder,
    floor module -> op folder, an op other than the matrix-state ops -> matrix_state."""
    ops = ROOT / "retention" / "ops"
    folders = sorted(f"retention.ops.{path.parent.name}" for path in ops.glob("*/__init__.py"))
    floor = sorted(f"retention.ops.{path.stem}" for path in ops.glob("*.py") if path.stem != "__init__")
    apart = [(a, b) for a in folders for b in folders if a != b]
    apart += [(module, folder) for module in floor for folder in folders]
    return apart + [(folder, MATRIX_STATE) for folder in folders if folder not in MATRIX_STATE_OPS]


def test_the_ops_are_siblings_on_one_floor():
    """Power retention, linear attention, GLA, the gated delta rule, attention and the convolution import none of
    each other: the decay math, chunk sizes and checks they share live on the floor beside them."""
    apart = _ops_apart()
    assert ("retention.ops.linear_attention", "retention.ops.power_retention") in apart
    assert ("retention.ops.power_retention", MATRIX_STATE) in apart
    assert (MATRIX_STATE, "retention.ops.power_retention") in apart
    crossing = _crossings(apart, _module_graph())
    assert not crossing, crossing


def test_no_module_imports_itself_back():
    """No import cycle among retention's modules, counting the imports inside functions (which would only hide
    one)."""
    assert not _cycles(_module_graph())


def test_the_cycle_check_sees_imports_inside_functions():
    source = "import a\nfrom b import c, x\n\ndef f():\n    from d import e\n"
    assert _edges(source, {"a", "b", "b.c", "d", "d.e"}) == {"a", "b", "b.c", "d.e"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert not _cycles({"a": {"b"}, "b": set()})


def test_kernels_are_a_leaf_reached_through_one_file():
    for path in _sources("pallas_kernels"):
        assert not [n for n in _imports(path) if n.split(".")[0] == "retention"], path
    importers = [
        str(path.relative_to(ROOT))
        for path in _sources("retention")
        if any(n.split(".")[0] == "pallas_kernels" for n in _imports(path))
    ]
    assert importers == KERNELS_IMPORTERS


EXPERIMENT_HELPERS = {"experiments.formatting", "experiments.timing", "experiments.plotting"}


def _experiment_layers() -> tuple[dict[str, int], dict[str, list[str]]]:
    """(each experiments module's layer, its imports): 0 the shared helpers, 1 the benchmarks, 2 the comparison
    (compare/), 3 the scripts that build on the comparison, directly or through another such script."""
    modules = {}
    for path in _sources("experiments"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = [n for n in _imports(path) if n.startswith("experiments")]
    in_compare = lambda name: name.startswith("experiments.compare")
    on_compare: set[str] = set()  # grows until every module that reads compare, directly or not, is in it
    builds_on_compare = lambda imports: any(in_compare(n) or n in on_compare for n in imports)
    while grown := {
        n for n, imports in modules.items() if not in_compare(n) and n not in on_compare and builds_on_compare(imports)
    }:
        on_compare |= grown
    layer = lambda name: (
        0
        if name in EXPERIMENT_HELPERS or name == "experiments"
        else 2
        if in_compare(name)
        else 3
        if name in on_compare
        else 1
    )
    return {name: layer(name) for name in modules}, modules


def test_experiments_run_downhill():
    layers, modules = _experiment_layers()
    assert layers["experiments.compare.report"] == 2  # the report lives inside the comparison
    assert layers["experiments.long_context.position"] == 3  # through long_context.models, which reads compare
    uphill = [
        f"{name} imports {n}"
        for name, imports in modules.items()
        for n in imports
        if n in layers and layers[n] > layers[name]
    ]
    assert not uphill, uphill


def test_the_ops_load_without_the_trainer_or_flax():
    code = (
        "import sys, retention, retention.ops\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'orbax', 'hydra', 'omegaconf', 'optax', 'flax'})\n"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_retention_loads_without_lm_eval_or_torch():
    """lm-eval comes with retention.eval.lm_eval_adapter alone, not with the package or retention.eval."""
    code = (
        "import sys, retention, retention.eval\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'lm_eval', 'torch'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_serving_and_generation_load_none_of_the_trainer_libraries():
    """generate, every serving module and the package face's serving names come without Hydra, OmegaConf, Orbax,
    tensorboardX or torch (the trainer's libraries, slow to import; Optax comes with Flax)."""
    code = (
        "import importlib, pkgutil, sys, retention, retention.generation, retention.serve\n"
        "for module in pkgutil.iter_modules(retention.serve.__path__):\n"
        "    importlib.import_module('retention.serve.' + module.name)\n"
        "retention.generate, retention.prefill, retention.load_snapshot, retention.serve.Engine\n"
        "heavy = {'hydra', 'omegaconf', 'orbax', 'tensorboardX', 'torch'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_missing_trainer_library_names_the_train_extra():
    """Without a library of the `train` extra (optax, hidden from the import system), the ops still import and
    `import retention.train` fails naming the missing module and the extra that installs it."""
    code = (
        "import sys\n"
        "sys.modules['optax'] = None\n"
        "import retention.ops\n"
        "try:\n"
        "    import retention.train\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e.name, '|', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    name, message = out.stdout.strip().split(" | ")
    assert name == "optax" and "'optax'" in message and "pip install 'retention-jax[train]'" in message, out.stdout


def test_a_missing_lm_eval_names_the_eval_extra():
    code = (
        "import sys\n"
        "sys.modules['lm_eval'] = None\n"
        "try:\n"
        "    import retention.eval.lm_eval_adapter\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e.name, '|', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    name, message = out.stdout.strip().split(" | ")
    assert name.split(".")[0] == "lm_eval" and "pip install 'retention-jax[eval]'" in message, out.stdout


def test_the_face_names_load_on_first_use():
    import retention

    for name in retention.__all__:
        assert getattr(retention, name) is not None
    assert callable(retention.generate) and callable(retention.load_run)
