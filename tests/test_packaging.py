"""The conda route (environment.yml) and the pip route (pyproject.toml) must not drift."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _env_pip():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return env, pip


def test_environment_yml_names_the_same_requirements():
    project = _pyproject()
    wanted = sorted(project["dependencies"] + project["optional-dependencies"]["dev"])
    _, pip = _env_pip()
    listed = sorted(r for r in pip if not r.startswith("-e"))
    assert listed == wanted


def test_environment_yml_installs_the_kit_editable_with_dev_extra():
    env, pip = _env_pip()
    assert '-e ".[dev]"' in pip
    assert "conda-forge" in env["channels"]
    pythons = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")]
    assert pythons == ["python>=3.11"]
    assert _pyproject()["requires-python"] == ">=3.11"


def test_required_runtime_packages_and_extras():
    project = _pyproject()
    names = {_name(r) for r in project["dependencies"]}
    assert {"jax", "numpy", "safetensors", "jupyterlab", "ipywidgets", "matplotlib",
            "psutil"} <= names
    extras = project["optional-dependencies"]
    assert any(r.startswith("jax[cuda12]") for r in extras["cuda12"])
    assert any(r.startswith("jax[cuda13]") for r in extras["cuda13"])
    assert {"pytest", "nbval", "ruff"} <= {_name(r) for r in extras["dev"]}
    assert project["name"] == "jax-device-kit"


def test_ci_calls_make_test():
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
             if ln.strip() and not ln.strip().startswith("#")]
    assert "make test" in lines


def test_ci_runs_jupyterlab_in_a_browser_after_make_test():
    """The browser tests are CI's, not optional: .ci/run installs Chromium if absent and runs
    them after make test; make test itself does not collect them."""
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    browser = next(i for i, ln in enumerate(lines) if ln.startswith("make test-browser"))
    assert browser > lines.index("make test")
    assert any("apt-get install" in ln and "chromium" in ln for ln in lines[:browser])
    assert "browser" in _pyproject()["optional-dependencies"]
    conftest = (ROOT / "tests" / "conftest.py").read_text()
    assert 'collect_ignore = ["browser"]' in conftest


def test_the_declared_jax_floor_is_the_tested_one():
    """pyproject's `jax>=X`, the seam's TESTED_FLOOR and the version CI tests agree."""
    from helpers._internal.jaxcompat import TESTED_FLOOR

    floor = ".".join(map(str, TESTED_FLOOR))
    deps = _pyproject()["dependencies"]
    assert f"jax>={floor.rsplit('.0', 1)[0]}" in [d.split("#")[0].strip() for d in deps]
    assert f"JAX_FLOOR  ?= {floor}" in (ROOT / "Makefile").read_text()
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "make test-floor" in [ln.strip() for ln in lines]
