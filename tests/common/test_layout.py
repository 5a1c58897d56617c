"""The package layout (issue 29; docs/design.md, "Where things are"): one subpackage per capability
plus ``common``, no import circles, each layer importing only what its rules allow, the public API;
the flat module names of the layout before it are gone (issue 34)."""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys
import textwrap

import pytest

import jax_gpuext

PKG_DIR = pathlib.Path(jax_gpuext.__file__).resolve().parent
CAPABILITIES = ("formats", "dot", "collectives", "memory", "checkpoints", "ragged_dot")
# What each package may import besides itself (the rule in its __init__ docstring). The package
# root (jax_gpuext/__init__.py) imports every capability, so no module below it may import it.
MAY_IMPORT = {
    "common": (),
    "formats": ("common",),
    "dot": ("common", "formats"),
    "memory": ("common",),
    "checkpoints": ("common", "formats"),
    "collectives": ("common", "memory", "dot", "formats"),  # dot / formats: the tensor-parallel demo
    "ragged_dot": ("common", "formats", "dot"),  # dot: one group's cuBLASLt scale layouts, the sm_90a build check
}
DOT_BACKENDS = ("reference", "xla", "cublaslt", "cudnn", "hopper_mx")
DOT_OPS = ("jax_gpuext.dot", "jax_gpuext.dot.block_scaled_dot", "jax_gpuext.dot.scaled_dot_general")


def _module_name(path: pathlib.Path) -> str:
    parts = ("jax_gpuext",) + path.relative_to(PKG_DIR).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PKG_DIR.rglob("*.py")) if "__pycache__" not in p.parts}


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The jax_gpuext modules ``name`` imports, at module level or inside functions.
    ``from P import x`` is an import of module P.x where that is a module, else of P."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x / from ..p import x
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    return {m for m in out if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in MAY_IMPORT else None


def test_one_package_per_capability_plus_common():
    for pkg in CAPABILITIES + ("common",):
        init = PKG_DIR / pkg / "__init__.py"
        assert init.is_file(), pkg
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "May import" in doc, f"{pkg}/__init__.py must open with what it holds and what it may import"
    flat = sorted(p.name for p in PKG_DIR.glob("*.py"))
    assert flat == ["__init__.py", "__main__.py", "demo.py"], flat  # everything else lives in a package


def test_the_import_graph_has_no_cycle():
    cycles, state, stack = [], {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(GRAPH[m]):
            if state.get(n) == "open":
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_function_level_imports():
    """The walker must see imports inside functions (the circles issue 29 removed hid there)."""
    assert "jax_gpuext.formats.fp4_layout" in GRAPH["jax_gpuext.formats.quantize"]  # inside _Fp4Packed.layout
    assert "jax_gpuext.collectives.distributed" in GRAPH["jax_gpuext.collectives.all_reduce"]


def test_each_layer_imports_only_what_its_rules_allow():
    bad = []
    for m, targets in GRAPH.items():
        if m in ("jax_gpuext", "jax_gpuext.__main__", "jax_gpuext.demo"):
            continue  # the composition root and the command line sit above every layer
        layer = _layer(m)
        assert layer is not None, f"{m} is outside every package"
        for t in targets:
            if t == "jax_gpuext" or _layer(t) not in (layer,) + MAY_IMPORT[layer]:
                bad.append(f"{m} -> {t}")
    assert not bad, "imports against the layer rules (docs/design.md, 'Where things are'):\n" + "\n".join(bad)


def test_common_imports_no_capability():
    for m, targets in GRAPH.items():
        if m.startswith("jax_gpuext.common"):
            assert all(_layer(t) == "common" for t in targets), (m, targets)


DOT_SHARED = {"jax_gpuext.dot.common", "jax_gpuext.dot.scale_range"}


def test_dot_backends_import_dot_common_never_an_op():
    for b in DOT_BACKENDS:
        targets = GRAPH[f"jax_gpuext.dot.{b}"]
        assert "jax_gpuext.dot.common" in targets, (b, targets)
        assert not targets & set(DOT_OPS), (b, targets & set(DOT_OPS))
        # dot.common and its helpers (dot.scale_range: the wide-scale MX path shared by the backends)
        assert all(_layer(t) in ("common", "formats") or t in DOT_SHARED for t in targets), (b, targets)
    # and the op owns the table: it imports every backend
    assert {f"jax_gpuext.dot.{b}" for b in DOT_BACKENDS} <= GRAPH["jax_gpuext.dot.block_scaled_dot"]


def test_every_module_imports_alone_in_a_fresh_interpreter():
    """Each module with the package root NOT run first (the root imports everything, which would
    hide a module that only works because something else was imported before it): a stand-in root
    package, then the module; the compiled extensions stay loaded between modules."""
    code = textwrap.dedent(f"""
        import importlib, importlib.machinery, sys, traceback, types
        import jax  # once: the slow part
        names = {sorted(MODULES)!r}
        keep = {{"jax_gpuext._cpu", "jax_gpuext._cuda", "jax_gpuext._nvshmem"}}
        failed = []
        for name in names:
            for m in [m for m in sys.modules if (m == "jax_gpuext" or m.startswith("jax_gpuext.")) and m not in keep]:
                del sys.modules[m]
            if name != "jax_gpuext":
                root = types.ModuleType("jax_gpuext")
                root.__spec__ = importlib.machinery.ModuleSpec("jax_gpuext", None, is_package=True)
                root.__spec__.submodule_search_locations = root.__path__ = [{str(PKG_DIR)!r}]
                sys.modules["jax_gpuext"] = root
            try:
                importlib.import_module(name)
            except BaseException:
                failed.append(name + ":\\n" + traceback.format_exc())
        print("\\n".join(failed) or "all imported")
        sys.exit(1 if failed else 0)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=300)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]


def test_public_api():
    want = ["all_reduce", "Backend", "block_scaled_dot", "BlockFormat", "BlockScaledArray", "capabilities",
            "dequantize", "distributed", "explain", "Explanation", "export_disabled_checks", "FP8_128x128", "FP8_TENSOR", "FP8_1x128",
            "from_blackwell_scale_layout", "gates", "MemorySpace", "MXFP8_E4M3", "MXFP4", "MXFP8_E5M2", "NVFP4",
            "place", "quantize", "scaled_dot_general", "Selection", "to_blackwell_scale_layout", "UnsupportedError",
            # issue 30: the grouped dot
            "GroupedBlockScaledArray", "quantize_grouped", "ragged_dot", "scaled_ragged_dot",
            # its other public names (issue 36's audit: errors and docs name them)
            "dequantize_grouped", "RAGGED_CONTRACT", "RAGGED_M", "RAGGED_M_NK",
            # issue 35: both axes from one read
            "quantize_both_axes",
            # issue 36: the masked layout for decode
            "ragged_dot_masked"]
    assert sorted(jax_gpuext.__all__) == sorted(want)
    ns = {}
    exec(f"from jax_gpuext import {', '.join(want)}", ns)  # noqa: S102 - the import users write
    assert all(ns[n] is getattr(jax_gpuext, n) for n in want)
    assert callable(jax_gpuext.explain) and callable(jax_gpuext.capabilities)
    assert jax_gpuext.gates is sys.modules["jax_gpuext.common.gates"]
    assert jax_gpuext.distributed is sys.modules["jax_gpuext.collectives.distributed"]


# Every public name of the old flat modules that are packages now (formats.py, dot.py, ...): each
# package re-exports them, as the same objects.
OLD_MODULE_NAMES = {
    "formats": "QUANTIZE_OP DEQUANTIZE_OP QUANTIZE_TARGET DEQUANTIZE_TARGET INPUT_DTYPES SCALE_ROUNDINGS BlockFormat "
               "MXFP8_E4M3 MXFP8_E5M2 NVFP4 FP8_1x128 FP8_128x128 FP8_TENSOR MXFP4 FORMATS FP4_PACKED BlockScaledArray "
               "as_array float_dtype scale_shape quantize dequantize to_blackwell_scale_layout "
               "from_blackwell_scale_layout demo_steps UnsupportedError _format_from_fields",
    "dot": "OP FormatInfo format_info mx_fp4_operand DotProblem to_canonical from_canonical per_batch global_alpha "
           "OUT_CODES element_code fold_scale_signs pack_fp4 register_impl block_scaled_dot recipe "
           "scaled_dot_general demo_steps",
    "collectives": "logger OP TARGET GRAPH_TARGET GRAPH_SAFE_ENV OPS ALGORITHM_CODES ALGORITHMS TIMEOUT_ENV "
                   "WORKSPACE_ENV ONE_SHOT_MAX_ENV DEFAULT_TIMEOUT_S DEFAULT_CPU_WORKSPACE_BYTES SUPPORTED_DTYPES "
                   "one_shot_max_bytes Problem command_buffer_ordering all_reduce tensor_parallel_mlp "
                   "shard_mlp_params demo_steps UnsupportedError",
    "memory": "logger GATE OPERANDS_ATTR RESULTS_ATTR SHIELD_ENV DSF_WORKAROUND_OPTIONS PLACE_TARGET MemorySpace "
              "CUSTOM_CALL_SPACES format_spaces VMAP_METHODS ffi_call place demo_steps UnsupportedError",
    "checkpoints": "MXFP4_BYTES_PER_BLOCK DEEPSEEK_TILE NVFP4_BLOCK CheckpointLayoutError from_gpt_oss_mxfp4 "
                   "to_gpt_oss_mxfp4 from_deepseek_fp8 to_deepseek_fp8 from_modelopt_nvfp4 to_modelopt_nvfp4 "
                   "SAFETENSORS_DTYPES read_safetensors write_safetensors read_tensors load_gpt_oss_mxfp4 "
                   "load_deepseek_fp8 load_modelopt_nvfp4",
}


@pytest.mark.parametrize("package", sorted(OLD_MODULE_NAMES))
def test_packages_reexport_their_old_modules_names(package):
    pkg = importlib.import_module(f"jax_gpuext.{package}")
    for name in OLD_MODULE_NAMES[package].split():
        value = getattr(pkg, name)  # AttributeError names the missing one
        if isinstance(value, type) or callable(value) and hasattr(value, "__code__"):
            # a function or class: the one its defining module has (not a copy or a wrapper)
            assert vars(sys.modules[value.__module__])[value.__name__] is value, (package, name)


def test_op_functions_win_over_their_modules_names():
    """formats.quantize, dot.block_scaled_dot, ... are modules AND the functions the old modules had:
    the package attribute is the function (as before); the module is reached by its full name."""
    from jax_gpuext.collectives.all_reduce import all_reduce
    from jax_gpuext.dot.block_scaled_dot import block_scaled_dot
    from jax_gpuext.dot.scaled_dot_general import scaled_dot_general
    from jax_gpuext.formats.quantize import quantize

    assert jax_gpuext.formats.quantize is quantize is jax_gpuext.quantize
    assert jax_gpuext.dot.block_scaled_dot is block_scaled_dot
    assert jax_gpuext.dot.scaled_dot_general is scaled_dot_general
    assert jax_gpuext.collectives.all_reduce is all_reduce
    assert sys.modules["jax_gpuext.formats.quantize"].quantize is quantize


# The flat module names of the layout before issue 29, removed in issue 34 (the package was never
# released with them): none imports or resolves as an attribute, and no finder of ours is installed.
OLD_FLAT_NAMES = ("_ext", "_ffi", "_libs", "_formats_reference", "backends", "cpu_features", "errors",
                  "verified", "fp4_layout", "reencode", "dot_xla", "dot_cublaslt", "dot_cudnn", "hopper_mx")


@pytest.mark.parametrize("old", OLD_FLAT_NAMES)
def test_the_old_flat_module_names_are_gone(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"jax_gpuext.{old}")
    assert not hasattr(jax_gpuext, old)
    assert not any(type(f).__module__.startswith("jax_gpuext") for f in sys.meta_path)


def test_fp4_probe_calls_the_handler_the_formats_op_names():
    """fp4_layout states the dequantize target and NVFP4's code itself (importing formats.quantize
    back would be a circle): they must stay the op's."""
    from jax_gpuext.formats import fp4_layout
    from jax_gpuext.formats.quantize import DEQUANTIZE_TARGET, NVFP4

    assert (fp4_layout.DEQUANTIZE_TARGET, fp4_layout.NVFP4_CODE) == (DEQUANTIZE_TARGET, NVFP4.code)
