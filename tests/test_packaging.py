"""The installed wheel: built from the source tree, installed without its dependencies into a fresh virtual
environment, its console script `retention-train` trains the tiny config for 2 steps in a folder outside any
checkout, composing the configs packaged in the wheel and writing its run folder under the working directory.

The fresh environment sees the libraries (jax, flax, the trainer's) of the environment running the tests through a
.pth line naming its site-packages. `venv --system-site-packages` would not: made from inside a virtual environment,
it sees the base interpreter's site-packages. A folder named in a .pth line has its own .pth files left unread, so
an editable install of the checkout there cannot map `retention`: it comes from the wheel, as the test checks."""

import json
import os
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import setuptools

from tests.train.common import ROOT, TINY

SOURCES = ("pyproject.toml", "README.md", "retention", "pallas_kernels", "configs")  # what the build reads


def test_the_listed_packages_are_every_package():
    """pyproject.toml lists the packages (the top-level configs/ is installed as retention.configs, which
    setuptools' find cannot discover): the list is every package under retention/ and pallas_kernels/, and that one."""
    listed = tomllib.loads((Path(ROOT) / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = setuptools.find_packages(ROOT, include=["retention*", "pallas_kernels*"])
    assert sorted(listed) == sorted([*found, "retention.configs"])


def _run(command: list, **kwargs) -> str:
    """Run `command`, returning its stdout; a failure shows its output."""
    out = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    assert out.returncode == 0, f"{command} exited {out.returncode}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out.stdout


@pytest.mark.integration
def test_the_console_script_trains_from_an_installed_wheel(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        path = Path(ROOT) / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(path, source / name)
    pip = [sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", source], cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("retention_jax-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"JAX_PLATFORMS": "cpu"}
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], env=env).strip()
    (Path(purelib) / "project-libraries.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([*pip, "--python", python, "install", "--no-deps", wheel])

    work = tmp_path / "work"
    work.mkdir()
    imported = _run([python, "-c", "import retention; print(retention.__file__)"], cwd=work, env=env).strip()
    assert Path(imported).is_relative_to(venv), imported
    _run([venv / "bin" / "retention-train", *TINY, "trainer.steps=2"], cwd=work, env=env, timeout=600)
    (run_dir,) = (work / "outputs" / "mqar").glob("*/*")  # the default run folder: outputs/<task>/<model>/<time>
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2
    assert (run_dir / "train.log").is_file() and (run_dir / ".hydra" / "config.yaml").is_file()
