"""The old module names of the flat layout (before the packages by capability, issue 29), kept working.

``import jax_gpuext.dot_xla``, ``from jax_gpuext import _ext`` and ``jax_gpuext._ext.ensure_all_registered()``
still work: each old name is an alias of the SAME module object as its new home
(``sys.modules["jax_gpuext._ext"] is sys.modules["jax_gpuext.common.extension"]``), so monkeypatching
through an old name changes the module the code runs. An old name of a public module that moved
warns (DeprecationWarning naming the new home) when it is first imported; private names and the two
public module attributes ``gates`` and ``distributed`` alias silently. The old names that are now
packages (``formats``, ``dot``, ``collectives``, ``memory``, ``checkpoints``) need no alias: each
package re-exports what its old module had.

``install`` (called by ``jax_gpuext/__init__.py``) puts a finder on ``sys.meta_path`` and answers the
package's ``__getattr__``. This module names the new homes as strings and imports them only when an
old name is used: it imports no capability package itself (common/ never does).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
import warnings

PACKAGE = "jax_gpuext"
# old name (under jax_gpuext) -> (new module, whether importing it by the old name warns)
ALIASES: dict[str, tuple[str, bool]] = {
    "_ext": ("jax_gpuext.common.extension", False),
    "_ffi": ("jax_gpuext.common.ffi", False),
    "_libs": ("jax_gpuext.common.libs", False),
    "_formats_reference": ("jax_gpuext.formats.reference", False),
    "gates": ("jax_gpuext.common.gates", False),
    "distributed": ("jax_gpuext.collectives.distributed", False),
    "backends": ("jax_gpuext.common.backends", True),
    "capabilities": ("jax_gpuext.common.capabilities", True),
    "cpu_features": ("jax_gpuext.common.cpu_features", True),
    "errors": ("jax_gpuext.common.errors", True),
    "explain": ("jax_gpuext.common.explain", True),
    "verified": ("jax_gpuext.common.verified", True),
    "fp4_layout": ("jax_gpuext.formats.fp4_layout", True),
    "reencode": ("jax_gpuext.formats.reencode", True),
    "dot_xla": ("jax_gpuext.dot.xla", True),
    "dot_cublaslt": ("jax_gpuext.dot.cublaslt", True),
    "dot_cudnn": ("jax_gpuext.dot.cudnn", True),
    "hopper_mx": ("jax_gpuext.dot.hopper_mx", True),
}

# Frames a warning must not be attributed to: the import machinery, this module, the package's
# __getattr__. The warning points at the code that used the old name.
_IMPORTLIB_DIR = os.path.dirname(importlib.__file__)
_PACKAGE_INIT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "__init__.py")


def _is_ours(filename: str) -> bool:
    return (filename.startswith("<frozen importlib") or filename.startswith(_IMPORTLIB_DIR)
            or filename in (__file__, _PACKAGE_INIT))


def _warn_deprecated(old: str, new: str) -> None:
    frame = sys._getframe(1)
    while frame is not None and _is_ours(frame.f_code.co_filename):
        frame = frame.f_back
    message = f"{old} moved to {new}; import it from there (the old name is an alias and will be removed)"
    if frame is None:
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return
    g = frame.f_globals
    warnings.warn_explicit(message, DeprecationWarning, frame.f_code.co_filename, frame.f_lineno,
                           g.get("__name__", "<string>"), g.setdefault("__warningregistry__", {}))


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, old: str, new: str, deprecated: bool):
        self.old, self.new, self.deprecated = old, new, deprecated

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self._own_spec = module.__spec__
        return module  # the same object: sys.modules[old] is sys.modules[new]

    def exec_module(self, module) -> None:
        module.__spec__ = self._own_spec  # module_from_spec bound the alias's spec; keep the module's own
        if self.deprecated:
            _warn_deprecated(self.old, self.new)


class _Finder(importlib.abc.MetaPathFinder):
    jax_gpuext_legacy = True

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package != PACKAGE or name not in ALIASES:
            return None
        new, deprecated = ALIASES[name]
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, new, deprecated))


class _Package(types.ModuleType):
    """The package's module type: the import system binds every submodule it loads on its parent,
    which for an old name that is also a public function of the package (``explain``,
    ``capabilities``) would replace the function by the module. The function stays."""

    def __setattr__(self, name, value):
        current = self.__dict__.get(name)
        if (name in ALIASES and isinstance(value, types.ModuleType) and current is not None
                and not isinstance(current, types.ModuleType)):
            return
        super().__setattr__(name, value)


def install(package: types.ModuleType) -> None:
    """Makes the old names of ``package`` (jax_gpuext) resolve; idempotent."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "jax_gpuext_legacy", False)]
    sys.meta_path.append(_Finder())
    package.__class__ = _Package


def package_getattr(name: str):
    """``jax_gpuext.<old name>`` without an import first (the package's ``__getattr__``)."""
    if name not in ALIASES:
        raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
    return importlib.import_module(f"{PACKAGE}.{name}")
