"""The fuzz worker (started by _pool.Worker): reads (kind, case) pickles from stdin, runs
``KINDS[kind](**case)`` and writes ("ok", value) or ("raised", exception type, message).

Every case function returns plain NumPy data (or per-backend outcomes of it), so the test
process can judge it without jax. A case that crashes this process is the finding itself.
"""

from __future__ import annotations

import copy
import os
import pathlib
import pickle
import struct
import sys

# Eight host devices for all_reduce, as tests/conftest.py sets for the main process.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

import jax_gpuext as gx  # noqa: E402
from jax_gpuext.common import extension as _ext  # noqa: E402

HEADER = struct.Struct("<Q")


def attempt(fn):
    """("ok", value) or ("raised", type name, message): one backend's outcome of a case."""
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the type is what the test judges
        return ("raised", type(e).__name__, str(e))


def make_format(spec):
    """("const", name): the module constant; ("pickled" / "copied", name): a copy of it made the
    way config systems and multiprocessing do; ("raw", value): whatever a user passed; ("pair",
    (lhs name, rhs name)): a tuple of the two constants."""
    how, value = spec
    if how == "raw":
        return value
    if how == "pair":
        return tuple(getattr(gx, name) for name in value)
    fmt = getattr(gx, value)
    if how == "pickled":
        return pickle.loads(pickle.dumps(fmt))
    return copy.deepcopy(fmt) if how == "copied" else fmt


def host(a):
    return np.asarray(a)


def bsa_parts(q):
    g = None if q.global_scale is None else host(q.global_scale)
    return {"data": host(q.data), "scale": host(q.scale), "global_scale": g, "axis": q.axis}


# --------------------------------------------------------------------------- public API cases
def quantize(x, fmt, axis, scale_rounding, global_scale, backends, out_dtype):
    """quantize then dequantize, jitted, once per backend."""
    def run(backend):
        f = make_format(fmt)
        q = jax.jit(lambda v: gx.quantize(v, f, axis=axis, scale_rounding=scale_rounding,
                                          global_scale=global_scale, backend=backend))(x)
        y = jax.jit(lambda q: gx.dequantize(q, out_dtype, backend=backend))(q)
        return {**bsa_parts(q), "y": host(y)}
    return {b: attempt(lambda b=b: run(b)) for b in backends}


def dequantize_parts(data, scale, global_scale, fmt, axis, backends, out_dtype):
    """A hand-built BlockScaledArray (what a checkpoint loader builds), dequantized per backend."""
    def run(backend):
        q = gx.BlockScaledArray(data, scale, global_scale, make_format(fmt), axis)
        return host(jax.jit(lambda q: gx.dequantize(q, out_dtype, backend=backend))(q))
    return {b: attempt(lambda b=b: run(b)) for b in backends}


def block_scaled_dot(lhs, rhs, formats, axes, dimension_numbers, out_dtype, backends):
    def run(backend):
        ql = gx.quantize(lhs, make_format(formats[0]), axis=axes[0])
        qr = gx.quantize(rhs, make_format(formats[1]), axis=axes[1])
        f = jax.jit(lambda a, b: gx.block_scaled_dot(a, b, dimension_numbers, preferred_element_type=out_dtype,
                                                     backend=backend))
        return host(f(ql, qr))
    return {b: attempt(lambda b=b: run(b)) for b in backends}


def scaled_dot_general(lhs, rhs, dimension_numbers, fmt, out_dtype, backends):
    def run(backend):
        f = make_format(fmt)
        return host(jax.jit(lambda a, b: gx.scaled_dot_general(a, b, dimension_numbers, preferred_element_type=out_dtype,
                                                              format=f, backend=backend))(lhs, rhs))
    return {b: attempt(lambda b=b: run(b)) for b in backends}


def place(x, space, strict, backends):
    def run(backend):
        return host(jax.jit(lambda v: gx.place(v, space, strict=strict, backend=backend))(x))
    return {b: attempt(lambda b=b: run(b)) for b in backends}


def all_reduce(x, mesh_shape, mesh_axes, axis_name, kwargs, algorithms):
    """x is split over every mesh axis (its leading dim is the device count); all_reduce runs
    inside shard_map, once per algorithm."""
    devices = np.array(jax.devices()[: int(np.prod(mesh_shape))]).reshape(mesh_shape)
    mesh = Mesh(devices, mesh_axes)

    def run(algorithm):
        body = lambda v: gx.all_reduce(v, axis_name, algorithm=algorithm, **kwargs)  # noqa: E731
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(mesh_axes), out_specs=P(mesh_axes), check_vma=False))
        return host(f(x))
    return {a: attempt(lambda a=a: run(a)) for a in algorithms}


def all_reduce_axes(x, mesh_shape, mesh_axes, vmaps, reduce, op, jit_inside, use_pmap, algorithms):
    """all_reduce over a mix of axis kinds. x has shape mesh_shape + [size of each vmap] + (3,):
    the leading dims are split over the mesh axes (shard_map) or the one pmap axis; ``vmaps`` =
    [(size, name), ...], outermost first, nest jax.vmap inside; ``reduce`` names the reduced axes
    (mesh, pmap and vmap names, in any order). Returns the result in x's shape per algorithm."""
    ndev = int(np.prod(mesh_shape))
    lead = len(mesh_shape)
    local = tuple(s for s, _ in vmaps) + (3,)

    def run(algorithm):
        def inner(r):
            return gx.all_reduce(r, reduce, op=op, algorithm=algorithm, timeout_s=30)

        fn = jax.jit(inner) if jit_inside else inner
        for _, name in reversed(vmaps):
            fn = jax.vmap(fn, axis_name=name)
        if use_pmap:
            f = jax.pmap(lambda v: fn(v.reshape(local)), axis_name=mesh_axes[0], devices=jax.devices()[:ndev])
            return host(f(x.reshape((ndev,) + local))).reshape(x.shape)
        devices = np.array(jax.devices()[:ndev]).reshape(mesh_shape)
        mesh = Mesh(devices, mesh_axes)
        body = lambda v: fn(v.reshape(local)).reshape((1,) * lead + local)  # noqa: E731
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(*mesh_axes), out_specs=P(*mesh_axes), check_vma=False))
        return host(f(x))
    return {a: attempt(lambda a=a: run(a)) for a in algorithms}


# --------------------------------------------------------------------------- FFI targets, directly
def ffi_call(target, operands, results, attributes):
    """jax.ffi.ffi_call of a registered target with whatever operands, result types and
    attributes the case names. ``results``: [(shape, dtype)]."""
    _ext.ensure_all_registered()
    out = [jax.ShapeDtypeStruct(s, d) for s, d in results]
    f = jax.jit(lambda *ops: jax.ffi.ffi_call(target, out)(*ops, **attributes))
    return [host(r) for r in f(*operands)]


def registrations():
    return sorted(_ext.module("cpu").registrations())


# --------------------------------------------------------------------------- checkpoint files
def read_checkpoint(path, then=None):
    """jax_gpuext's reader of a checkpoint file (``ours``) and what the file must give
    (``expected``, tests/_safetensors_files.py: safetensors' own reader for .safetensors; for .npz,
    np.load, asked only once ours loaded, so its sizes are known to be sane). Both run here: a
    crash in either is a finding, not the end of the test run.

    ``then``: after reading, "rewrite" (write_safetensors over the file) or "truncate" it (in
    place), then touch every array again: an array still backed by the file would change, or die
    of SIGBUS, here. ``unchanged`` says whether every array kept its bytes."""
    if str(pathlib.Path(__file__).parents[1]) not in sys.path:
        sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
    import _safetensors_files as sf
    from jax_gpuext import checkpoints

    with open(path, "rb") as f:
        blob = f.read()
    ours = attempt(lambda: checkpoints.read_tensors(path))
    out = {"ours": ours}
    if path.endswith(".safetensors"):
        out["expected"] = sf.expected(blob)
        out["metadata"] = attempt(lambda: checkpoints.read_safetensors_metadata(path))
    elif ours[0] == "ok":
        out["expected"] = attempt(lambda: dict(np.load(path, allow_pickle=False)))
    if then and ours[0] == "ok":
        before = {k: v.tobytes() for k, v in ours[1].items()}
        if then == "rewrite":
            checkpoints.write_safetensors(path, {"other": np.arange(3, dtype=np.float32)})
        else:
            with open(path, "r+b") as f:
                f.truncate(0)
        out["unchanged"] = all(v.tobytes() == before[k] for k, v in ours[1].items())
    return out


KINDS = {f.__name__: f for f in (quantize, dequantize_parts, block_scaled_dot, scaled_dot_general, place,
                                 all_reduce, all_reduce_axes, ffi_call, registrations,
                                 read_checkpoint)}


def main():
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = stdin.read(HEADER.size)
        if len(header) < HEADER.size:
            return
        kind, case = pickle.loads(stdin.read(HEADER.unpack(header)[0]))
        result = attempt(lambda: KINDS[kind](**case))
        blob = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        stdout.write(HEADER.pack(len(blob)) + blob)
        stdout.flush()


if __name__ == "__main__":
    main()
