"""The house's import rules, read from the source: every import runs downhill (validation <- ops, parallel, data <-
nn <- train <- the face: load, export, hf, generation, serve <- eval, the lm-eval adapter), the Pallas kernels import
nothing of `retention` and are reached only through the power-retention op's pallas.py, experiments/ runs downhill
too (its helpers <- the benchmarks <- compare/ <- the scripts built on the comparison), `import retention.ops` loads
neither the trainer's libraries nor Flax, `import retention` neither lm-eval nor torch, and a missing trainer
library names the `train` extra."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = {
    "retention.validation": 0,
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
KERNELS_IMPORTER = "retention/ops/power_retention/pallas.py"


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


def test_imports_run_downhill():
    uphill = []
    for path in _sources("retention"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        own = _layer(module)
        if own is None:
            continue
        for name in _imports(path):
            other = _layer(name)
            if other is not None and other > own:
                uphill.append(f"{module} imports {name}")
    assert not uphill, uphill


def test_kernels_are_a_leaf_reached_through_one_file():
    for path in _sources("pallas_kernels"):
        assert not [n for n in _imports(path) if n.split(".")[0] == "retention"], path
    importers = [
        str(path.relative_to(ROOT))
        for path in _sources("retention")
        if any(n.split(".")[0] == "pallas_kernels" for n in _imports(path))
    ]
    assert importers == [KERNELS_IMPORTER]


EXPERIMENT_HELPERS = {"experiments.formatting", "experiments.timing", "experiments.plotting"}


def _experiment_layers() -> tuple[dict[str, int], dict[str, list[str]]]:
    """(each experiments module's layer, its imports): 0 the shared helpers, 1 the benchmarks, 2 the comparison
    (compare/), 3 the scripts that build on the comparison."""
    modules = {}
    for path in _sources("experiments"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = [n for n in _imports(path) if n.startswith("experiments")]
    layer = lambda name, imports: (
        0
        if name in EXPERIMENT_HELPERS or name == "experiments"
        else 2
        if name.startswith("experiments.compare")
        else 3
        if any(n.startswith("experiments.compare") for n in imports)
        else 1
    )
    return {name: layer(name, imports) for name, imports in modules.items()}, modules


def test_experiments_run_downhill():
    layers, modules = _experiment_layers()
    assert layers["experiments.compare.report"] == 2  # the report lives inside the comparison
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
