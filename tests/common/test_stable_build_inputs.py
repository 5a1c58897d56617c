"""A second install from the same checkout reuses the first build (issue 34): the inputs that come
from pip's temporary build environment are mirrored at stable paths (cmake/stable_inputs.cmake),
and each build configuration has its own persistent build directory (build_backend)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")

SCRIPT = """
set(CMAKE_BINARY_DIR "{binary}")
include("{repo}/cmake/stable_inputs.cmake")
gpuext_stable_dir(out "{src}" demo)
file(WRITE "{binary}/result.txt" "${{out}}")
"""


def configure(tmp_path, src: pathlib.Path) -> pathlib.Path:
    script = tmp_path / "probe.cmake"
    script.write_text(SCRIPT.format(binary=tmp_path / "build", repo=REPO, src=src))
    subprocess.run(["cmake", "-P", str(script)], check=True, capture_output=True, text=True)
    return pathlib.Path((tmp_path / "build" / "result.txt").read_text())


def env_dir(tmp_path, name: str, files: dict) -> pathlib.Path:
    root = tmp_path / f"pip-build-env-{name}" / "overlay" / "site-packages" / "pkg" / "include"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_new_temporary_environment_maps_to_the_same_unchanged_files(tmp_path):
    first = env_dir(tmp_path, "aaaa", {"a.h": "int a;", "sub/b.h": "int b;", "gone.h": ""})
    mirror = configure(tmp_path, first)
    assert mirror == tmp_path / "build" / "stable-inputs" / "demo" / "include"  # the source's own name kept
    assert (mirror / "sub" / "b.h").read_text() == "int b;"
    stamps = {p: os.stat(mirror / p).st_mtime_ns for p in ("a.h", "sub/b.h")}
    shutil.rmtree(tmp_path / "pip-build-env-aaaa")  # pip deletes it after the build
    # the next install: another temporary path, one header changed, one dropped
    second = env_dir(tmp_path, "bbbb", {"a.h": "int a;", "sub/b.h": "int b2;"})
    os.utime(second / "a.h", ns=(1, 1))  # a new copy of an unchanged file: its own timestamp
    assert configure(tmp_path, second) == mirror  # the same path on every compile command
    assert os.stat(mirror / "a.h").st_mtime_ns == stamps["a.h"]  # unchanged: not touched
    assert (mirror / "sub" / "b.h").read_text() == "int b2;"  # changed: copied
    assert not (mirror / "gone.h").exists()


def test_a_directory_outside_a_build_environment_is_used_where_it_is(tmp_path):
    src = tmp_path / "toolkit" / "include"
    src.mkdir(parents=True)
    assert configure(tmp_path, src) == src


@pytest.fixture
def backend(monkeypatch, tmp_path):
    """build_backend/jax_gpuext_build.py itself, with scikit-build-core (a build requirement only)
    stood in for: only our logic around its hooks is under test."""
    import importlib.util
    import types

    fake = types.ModuleType("scikit_build_core.build")
    for hook in ("build_editable", "build_wheel", "build_sdist", "get_requires_for_build_sdist",
                 "prepare_metadata_for_build_editable", "prepare_metadata_for_build_wheel",
                 "get_requires_for_build_editable", "get_requires_for_build_wheel"):
        setattr(fake, hook, lambda *a, **k: None)
    package = types.ModuleType("scikit_build_core")
    package.__version__ = "9.9.9"
    cmake = types.ModuleType("scikit_build_core.cmake")
    cmake.DIR = tmp_path / "pip-build-env-new" / "site-packages" / "scikit_build_core"
    package.cmake = cmake
    monkeypatch.setitem(sys.modules, "scikit_build_core", package)
    monkeypatch.setitem(sys.modules, "scikit_build_core.build", fake)
    monkeypatch.setitem(sys.modules, "scikit_build_core.cmake", cmake)
    spec = importlib.util.spec_from_file_location("_backend_under_test", REPO / "build_backend" / "jax_gpuext_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_configuration_has_its_own_persistent_build_directory(backend, monkeypatch):
    monkeypatch.setenv("JAX_GPUEXT_CUDA", "OFF")
    assert backend.with_build_dir({})["build-dir"] == "build/{wheel_tag}-cpu"
    assert backend.with_build_dir({"build-dir": "elsewhere"})["build-dir"] == "elsewhere"
    monkeypatch.setenv("JAX_GPUEXT_CUDA", "AUTO")
    monkeypatch.setattr(backend, "find_cuda_compiler", lambda cs=None: "/fake/nvcc")
    monkeypatch.setattr(backend, "cuda_version", lambda nvcc: (13, 0))
    monkeypatch.setenv("JAX_GPUEXT_CUDA_ARCHITECTURES", "90a-real")
    assert backend.with_build_dir(None)["build-dir"] == "build/{wheel_tag}-cuda13-90a_real"
    monkeypatch.delenv("JAX_GPUEXT_CUDA_ARCHITECTURES")
    assert backend.with_build_dir(None)["build-dir"] == "build/{wheel_tag}-cuda13-default"


def test_the_objects_survive_a_new_temporary_environment(backend, tmp_path):
    """scikit-build-core clears CMakeCache.txt and CMakeFiles/ (the objects) when its recorded path
    is another environment's; the backend adopts its own configuration's directory first."""
    import json

    source = tmp_path / "checkout"
    mine, other, foreign = (source / "build" / f"{t}-{c}" for t, c in (("cp311-x", "cpu"), ("cp311-x", "cuda13-default"),
                                                                         ("cp312-y", "cpu")))
    for d, version, src in ((mine, "9.9.9", source), (other, "9.9.9", source), (foreign, "1.0", source)):
        d.mkdir(parents=True)
        (d / ".skbuild-info.json").write_text(json.dumps({
            "source_dir": str(src), "skbuild_version": version,
            "skbuild_path": "/tmp/pip-build-env-old/site-packages/scikit_build_core"}))
    assert backend.adopt_build_dirs("cpu", str(source)) == [str(mine)]
    assert json.loads((mine / ".skbuild-info.json").read_text())["skbuild_path"] == str(
        sys.modules["scikit_build_core.cmake"].DIR)
    # another configuration's directory, and one of another scikit-build-core version, are left alone
    assert "pip-build-env-old" in (other / ".skbuild-info.json").read_text()
    assert "pip-build-env-old" in (foreign / ".skbuild-info.json").read_text()
    assert backend.adopt_build_dirs("cpu", str(tmp_path / "elsewhere")) == []
