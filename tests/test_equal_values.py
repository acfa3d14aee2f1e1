"""The same formula of the same numbers has the same value at every position.

A CPU kernel computes a tile's pairs (and a chunk's columns) by vectors across j; a
scalar remainder loop would compute the last ones with the scalar libm functions, which
differ from libmvec's vector ones in the last bit: identical points would then get
different values at different positions, and the tie rule ("ties go to the lowest
index") would break. For every elementwise op of the registry, in the pair loop (``op(u_i
+ x_j)``) and in the values of one side only (``op(x_j) + op(u_i)``: the staged columns
and the row values), both reductions' dimensions, float32 and float64, and numbers of
identical points that end tiles in the vector body and past it:

- identical points on the reduced side: argmin is 0, argKmin is [0, 1, 2], min_argmin's
  index is 0, for every output row;
- identical points on the output side: every output row is the same (sums, minima and
  their indices), bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from lazytensor.codegen import ops

from lazytensor import Vi, Vj

# the registry's elementwise ops, in chunks whose formulas (two components per op) stay
# within the CPU pair loop's vector width (codegen.cpu.WIDE = 16 components)
_OPS = sorted(n for n, o in ops.REGISTRY.items() if o.elementwise)
_CHUNKS = [_OPS[k:k + 8] for k in range(0, len(_OPS), 8)]
_PARAMS = {"pow": (1.7,), "softmax_weight": (1,)}
_SIZES = (7, 17, 33, 67)  # tiles ending in the vector body and past it
_REDUCTIONS = ("argmin", "argKmin", "min_argmin", "sum")


def _args(name: str, a):
    """The operands of op ``name`` built from ``a`` (values in (0.2, 0.9)), in its domain
    (integer constants: a real number would be a parameter, and an expression of a
    parameter is no column)."""
    if name == "acosh":
        a = a + 1
    arity = ops.get(name).arity
    if arity == 1:
        return [a]
    if arity == 2:
        return [a, a * 2 + 1]
    if name == "ifelse":
        return [a * 2 - 1, a, a * 2]
    return [a, a * a * 2, a + 1]  # clamp


def _apply(name: str, a):
    first, *others = _args(name, a)
    return first._op(name, *others, params=_PARAMS.get(name, ()))


def _formula(chunk, U, X):
    """Per op: its value at u + x (the pair loop), and at x plus at u (one side only)."""
    parts = []
    for name in chunk:
        parts.append(_apply(name, U + X))
        parts.append(_apply(name, X) + _apply(name, U))
    out = parts[0]
    for p in parts[1:]:
        out = out.concat(p)
    return out


def _column_formula(chunk, U, X8):
    """Per op: a costly expression of the reduced side's variable alone (computed once per
    column before the pair loop), times the output side's variable."""
    out = None
    for name in chunk:
        part = U * _apply(name, X8).sum()
        out = part if out is None else out.concat(part)
    return out


def _reduce(f, reduction: str, dim: int):
    if reduction == "argKmin":
        return [np.asarray(f.argKmin(3, dim=dim))]
    if reduction == "min_argmin":
        return [np.asarray(a) for a in f.min_argmin(dim=dim)]
    return [np.asarray(getattr(f, reduction)(dim=dim))]


def _side(values, dim: int, reduced: bool):
    """``values`` (n, 1) as the variable of the reduced side (``reduced``) or of the output
    side, for a reduction over ``dim``."""
    over_j = (dim == 1) == reduced
    return Vj(values) if over_j else Vi(values)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("reduction", _REDUCTIONS)
def test_identical_points_have_identical_values(dtype, dim, reduction, rng):
    for chunk in _CHUNKS:
        for n in _SIZES:
            same = np.full((n, 1), rng.uniform(0.1, 0.45), dtype=dtype)
            same8 = np.tile(rng.uniform(0.1, 0.45, (1, 8)), (n, 1)).astype(dtype)
            other = rng.uniform(0.1, 0.45, (21, 1)).astype(dtype)
            # the identical points on the reduced side: ties, to the lowest index
            for f in (_formula(chunk, _side(other, dim, False), _side(same, dim, True)),
                      _column_formula(chunk, _side(other, dim, False), _side(same8, dim, True))):
                if reduction == "sum":
                    break
                got = _reduce(f, reduction, dim)[-1]
                want = np.arange(3)[:, None] if reduction == "argKmin" else 0  # (n, K, F)
                want = np.broadcast_to(want, got.shape)
                assert np.array_equal(got, want), (chunk, n, dtype, dim, reduction, got)
            # the identical points on the output side: identical rows
            f = _formula(chunk, _side(same, dim, False), _side(other, dim, True))
            for got in _reduce(f, reduction, dim):
                assert got.shape[0] == n
                assert np.array_equal(got, np.broadcast_to(got[:1], got.shape), equal_nan=True), (
                    chunk, n, dtype, dim, reduction, got)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_identical_columns_of_block_sparse_intervals_have_identical_values(dtype, rng):
    """A block-sparse sum stages the columns of consecutive intervals together (computed
    columns too): two blocks of identical rows over the same 40 identical columns, one as
    one interval and one as four of 10, have identical sums."""
    n, m = 8, 40
    u = np.full((n, 1), rng.uniform(0.1, 0.45), dtype=dtype)
    x8 = np.tile(rng.uniform(0.1, 0.45, (1, 8)), (m, 1)).astype(dtype)
    ranges = (np.array([[0, 4], [4, 8]]), np.array([1, 5]),
              np.array([[0, 40], [0, 10], [10, 20], [20, 30], [30, 40]]),
              np.array([[0, 40]]), np.array([2]), np.array([[0, 4], [4, 8]]))
    for chunk in _CHUNKS:
        f = _column_formula(chunk, Vi(u), Vj(x8))
        f.ranges = ranges
        got = np.asarray(f.sum(dim=1))
        assert np.array_equal(got, np.broadcast_to(got[:1], got.shape), equal_nan=True), (
            chunk, dtype, got)
