"""Bad input to the grouped dot and its quantizers (issue 34): every public entry point refuses it
at trace time, naming itself and the argument, the same for a list as for an array."""

from __future__ import annotations

import numpy as np
import pytest

import jax.numpy as jnp

import jax_gpuext as gx
from jax_gpuext.ragged_dot.grouped import dequantize_grouped, quantize_grouped
from jax_gpuext.ragged_dot.ragged_dot import ragged_dot
from jax_gpuext.ragged_dot.scaled_ragged_dot import scaled_ragged_dot

G, M, K, N = 2, 16, 32, 8


def _entry_points():
    x = np.ones((M, K), np.float32)
    w = np.ones((G, K, N), np.float32)
    q = gx.quantize(x, gx.MXFP8_E4M3)
    qw = gx.quantize(w, gx.MXFP8_E4M3, axis=1)
    qg = quantize_grouped(x, gx.MXFP8_E4M3, np.array([8, 8], np.int32), axis=0)
    return {
        "ragged_dot": lambda gs: ragged_dot(q, qw, gs),
        "scaled_ragged_dot": lambda gs: scaled_ragged_dot(x, w, gs),
        "quantize_grouped": lambda gs: quantize_grouped(x, gx.MXFP8_E4M3, gs, axis=0),
        "dequantize_grouped": lambda gs: dequantize_grouped(qg, gs),
    }


BAD_LISTS = [
    ([8.7, 7.2], TypeError, r"group_sizes\[0\] must be an int.*float"),
    ([True, True], TypeError, r"group_sizes\[0\] must be an int.*bool"),
    (["8", "8"], TypeError, r"group_sizes\[0\] must be an int.*str"),
    ([float("nan"), 8], TypeError, r"group_sizes\[0\] must be an int"),
    ([2**40, 8], ValueError, r"group_sizes\[0\] = 1099511627776 does not fit in int32"),
    ([[8], [8]], TypeError, r"group_sizes\[0\] must be an int.*list"),
]


@pytest.mark.parametrize("values,error,match", BAD_LISTS, ids=[repr(v[0]) for v in BAD_LISTS])
@pytest.mark.parametrize("entry", ["ragged_dot", "scaled_ragged_dot", "quantize_grouped", "dequantize_grouped"])
def test_a_list_of_group_sizes_is_read_exactly_or_refused(entry, values, error, match):
    call = _entry_points()[entry]
    with pytest.raises(error, match=match) as e:
        call(values)
    assert str(e.value).startswith(f"{entry}:"), str(e.value)


@pytest.mark.parametrize("entry", ["ragged_dot", "scaled_ragged_dot", "quantize_grouped", "dequantize_grouped"])
def test_a_list_of_ints_is_the_same_as_the_array(entry):
    call = _entry_points()[entry]
    got, want = call([8, 8]), call(np.array([8, 8], np.int32))
    for a, b in zip(np.atleast_1d(jnp.asarray(getattr(got, "data", got))),
                    np.atleast_1d(jnp.asarray(getattr(want, "data", want)))):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
