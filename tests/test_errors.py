"""Misuse and edge cases, one table: each row is a clear exception or a defined result.

An exception row gives the exception type and the substrings its message must contain:
the variable (its category or label), its shape / dtype / device, and what was expected.
A result row gives a check of the returned value. Defined results for edge cases:

- empty reductions (M = 0): sums give 0, min gives +inf, max gives -inf, arg-reductions
  give -1, logsumexp gives -inf, the softmax-weighted sum gives NaN (0 / 0); N = 0 gives
  outputs with 0 rows;
- NaN and inf propagate as in NumPy: a sum or min with a NaN term is NaN, argmin/argmax
  return the first NaN's index, K-min orders NaN last (as ``np.sort``), +inf - inf is NaN;
- non-contiguous and negative-stride views give the same results as contiguous copies.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
import torch

from lazytensor import LazyTensor, Pm, Vi, Vj

_rng = np.random.default_rng(20240611)
X = _rng.uniform(-1, 1, (10, 3))  # i-data, N = 10, D = 3
Y = _rng.uniform(-1, 1, (20, 3))  # j-data, M = 20, D = 3
B = _rng.uniform(-1, 1, (20, 2))  # K @ B
Y4 = _rng.uniform(-1, 1, (20, 4))
X1 = X[:, :1].copy()  # D = 1
Y1 = Y[:, :1].copy()
EMPTY_J = np.zeros((0, 1))


def dot():
    """The scalar formula <x_i, y_j> (one kernel per reduction, shared by many rows)."""
    return (Vi(X) * Vj(Y)).sum(-1)


def dense_dot(x=X, y=Y):
    return x @ y.T


def gauss():
    return (-Vi(X).sqdist(Vj(Y))).exp()


def scalar_on(y):
    """x_i * y_j for D = 1 with the given j-data."""
    return Vi(X1) * Vj(y)


@dataclass
class Case:
    id: str
    run: Callable[[], object]
    raises: type | None = None
    names: tuple = ()  # substrings the message must contain
    check: Callable[[object], None] | None = None
    marks: tuple = ()


def close(expected):
    def check(result):
        np.testing.assert_allclose(np.asarray(result), expected, rtol=1e-12, atol=1e-12)

    return check


def equal(expected):
    def check(result):
        np.testing.assert_array_equal(np.asarray(result), expected)

    return check


def all_of(*checks):
    def check(result):
        for c in checks:
            c(result)

    return check


def shape(expected):
    def check(result):
        assert tuple(result.shape) == expected

    return check


def _with_nan(y, rows, value=np.nan):
    y = y.copy()
    y[list(rows), 0] = value
    return y


Y_NAN = _with_nan(Y1, [5, 7])
Y_INF = _with_nan(_with_nan(Y1, [4], np.inf), [6], -np.inf)  # +inf and -inf terms
Y_POS_INF = _with_nan(Y1, [4, 9], np.inf)
X_POS = np.abs(X1) + 0.5  # so that x_i * (+-inf) keeps its sign


def _nan_kmin_expected():
    v = X1[:, None, 0] * Y_NAN[None, :, 0]
    return np.sort(v, axis=1)[:, :20]


def _sumsoftmax_empty():
    return (Vi(X1) * Vj(EMPTY_J)).sumsoftmaxweight(Vj(np.zeros((0, 2))), dim=1)


def _torch_empty_grad():
    x = torch.tensor(X1, requires_grad=True)
    (Vi(x) * Vj(torch.zeros(0, 1, dtype=torch.float64))).sum(dim=1).sum().backward()
    return x.grad


def _deep_chain():
    f = dot()
    for _ in range(600):  # deeper than Python's recursion limit allows a recursive printer
        f = f.sin()
    return f.sum(dim=1), f.sum(dim=1, backend="numpy")


_SHARED_DAG = """
import numpy as np
from lazytensor import Vi, Vj
x, y = np.linspace(-1, 1, 10)[:, None], np.linspace(0, 1, 20)[:, None]
f = Vi(x) * Vj(y)
for _ in range(40):  # as a tree: 3^40 leaves; as a DAG: 40 levels
    f = (f * f + f) * 0.25
np.testing.assert_allclose(f.sum(dim=1), f.sum(dim=1, backend="numpy"), rtol=1e-10, atol=1e-300)
assert len(f.variables) == 42  # x, y and one scalar per level (f * f shares them)
"""


def _shared_dag():
    """In a subprocess with a timeout: a pass that walks the DAG as a tree never ends."""
    proc = subprocess.run(
        [sys.executable, "-c", _SHARED_DAG], capture_output=True, text=True, timeout=60, check=False
    )
    return proc


def _exited_ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]


def _pair_close(pair):
    np.testing.assert_allclose(pair[0], pair[1], rtol=1e-10, atol=1e-300)


CASES = [
    # ------------------------------------------------------- i / j / batch sizes
    Case(
        "i_rows_mismatch",
        lambda: (Vi(X) - Vi(X[:9]) + Vj(Y)).sum(-1).sum(dim=1),
        ValueError,
        ("i-variable", "(9, 3)", "(10, 3)", "rows"),
    ),
    Case(
        "j_rows_mismatch",
        lambda: (Vj(Y) - Vj(Y[:19]) + Vi(X)).sum(-1).sum(dim=1),
        ValueError,
        ("j-variable", "(19, 3)", "(20, 3)", "same number of rows"),
    ),
    Case(
        "batch_mismatch",
        lambda: (
            (LazyTensor(np.ones((2, 10, 1, 3))) - LazyTensor(np.ones((3, 1, 20, 3))))
            .sum(-1)
            .sum(dim=2)
        ),
        ValueError,
        ("j-variable", "(3, 20, 3)", "batch dimension 0", "equal or 1"),
    ),
    Case(
        "batch_broadcast_1_against_3",
        lambda: (
            (LazyTensor(X[None, :, None, :]) * LazyTensor(np.stack([Y, 2 * Y, 3 * Y])[:, None]))
            .sum(-1)
            .sum(dim=2)
        ),
        check=close(np.stack([k * dense_dot().sum(1, keepdims=True) for k in (1, 2, 3)])),
    ),
    Case(
        "vector_dims_3_vs_4",
        lambda: Vi(X) - Vj(Y4),
        ValueError,
        (
            "incompatible vector dimensions [3, 4]",
            "i-variable",
            "(10, 3)",
            "j-variable",
            "(20, 4)",
            "equal dimensions, or dimension 1",
        ),
    ),
    Case(
        "vector_dims_labels",
        lambda: Vi(X, label="x") * Vj(Y4, label="y"),
        ValueError,
        ("'x'", "'y'", "(20, 4)"),
    ),
    Case(
        "vector_dim_1_broadcasts", lambda: (Vi(X1) * Vj(Y)).sum(dim=1), check=close(X1 * Y.sum(0))
    ),
    Case(
        "vector_dim_0",
        lambda: Vi(np.zeros((10, 0))),
        ValueError,
        ("(10, 0)", "vector dimension is 0"),
    ),
    # ------------------------------------------------------- K @ v
    Case(
        "matmul_wrong_M",
        lambda: gauss() @ B[:19],
        ValueError,
        ("j-variable", "(19, 2)", "(20, 3)", "rows"),
    ),
    Case(
        "matmul_vector_formula",
        lambda: (Vi(X) - Vj(Y)) @ B,
        ValueError,
        ("scalar formula", "dimension 3"),
    ),
    Case("matmul_lazytensor", lambda: gauss() @ Vj(B), TypeError, ("LazyTensor", "(M, E)")),
    Case("matmul_string", lambda: gauss() @ "abc", TypeError, ("str",)),
    Case("matmul_0d", lambda: gauss() @ np.array(1.0), ValueError, ("0D", "(M, E)")),
    Case(
        "matmul_1d",
        lambda: gauss() @ B[:, 0],
        check=close(np.exp(-((X[:, None] - Y[None]) ** 2).sum(-1)) @ B[:, 0]),
    ),  # (N,), as pykeops
    Case(
        "matmul_batched_v",
        lambda: gauss() @ np.stack([B, -B]),  # (2, M, E): result (2, N, E)
        check=close(
            np.stack([k * np.exp(-((X[:, None] - Y[None]) ** 2).sum(-1)) @ B for k in (1, -1)])
        ),
    ),
    # ------------------------------------------------------- dtypes and libraries
    Case(
        "mixed_float32_float64",
        lambda: (Vi(X.astype(np.float32)) * Vj(Y)).sum(-1).sum(dim=1),
        TypeError,
        ("mixed dtypes", "i-variable", "float32", "j-variable", "float64"),
    ),
    Case(
        "int64_numpy",
        lambda: (Vi(np.arange(10)) * Vj(Y1)).sum(dim=1),
        TypeError,
        ("i-variable", "(10, 1)", "int64", "expected float32 or float64"),
    ),
    Case(
        "int32_torch",
        lambda: (Vi(torch.arange(10, dtype=torch.int32)) * Vj(torch.tensor(Y1))).sum(dim=1),
        TypeError,
        ("i-variable", "int32", "device cpu", "expected float32 or float64"),
    ),
    Case(
        "bool_array",
        lambda: (Vi(np.ones(10, dtype=bool)) * Vj(Y1)).sum(dim=1),
        TypeError,
        ("i-variable", "bool", "expected float32 or float64"),
    ),
    Case(
        "float16_with_other_dtypes",
        lambda: (Vi(X.astype(np.float16)) * Vj(Y)).sum(-1).sum(dim=1),
        TypeError,
        ("float16", "(10, 3)", "mixed dtypes"),
    ),
    Case(
        "object_array",
        lambda: (Vi(np.array([1.0, 2.0], dtype=object)) * Vj(Y1[:2])).sum(dim=1),
        TypeError,
        ("i-variable", "object", "(2, 1)", "expected float32 or float64"),
    ),
    Case(
        "complex_min",
        lambda: (Vi(X + 1j) * Vj(Y)).sum(-1).min(dim=1),
        NotImplementedError,
        ("min", "complex LazyTensor", "only sums"),
    ),
    Case(
        "complex_torch_log",
        lambda: Vj(torch.ones(20, 3, dtype=torch.complex64)).log(),
        NotImplementedError,
        ("log", "complex LazyTensor", ".real"),
    ),
    Case("list_of_strings", lambda: Vi(["a", "b"]), TypeError, ("list", "float")),
    Case(
        "numpy_with_torch",
        lambda: (Vi(X) * Vj(torch.tensor(Y))).sum(-1).sum(dim=1),
        TypeError,
        ("cannot mix NumPy arrays and torch tensors", "i-variable", "j-variable", "device cpu"),
    ),
    Case(
        "torch_param_with_numpy",
        lambda: (Vi(X) * Pm(torch.ones(3, dtype=torch.float64))).sum(-1).sum(dim=1),
        TypeError,
        ("cannot mix", "parameter", "(3,)"),
    ),
    Case(
        "requires_grad_with_int_tensor",
        lambda: (
            Vi(torch.ones(10, 1, dtype=torch.float64, requires_grad=True))
            * Vj(torch.arange(20).reshape(20, 1))
        ).sum(dim=1),
        TypeError,
        ("j-variable", "(20, 1)", "int64", "expected float32 or float64"),
    ),
    Case(
        "requires_grad_on_int_refused_by_torch",
        lambda: torch.arange(10).requires_grad_(),
        RuntimeError,
        ("floating point",),
    ),
    Case(
        "python_float_keeps_float32",
        lambda: (Vi(X1.astype(np.float32)) * 2.5 * Vj(Y1.astype(np.float32))).sum(dim=1).dtype,
        check=lambda dt: dt == np.float32,
    ),
    # ------------------------------------------------------- empty reductions
    Case("N0_sum", lambda: (Vi(np.zeros((0, 1))) * Vj(Y1)).sum(dim=1), check=shape((0, 1))),
    Case("M0_sum_zeros", lambda: scalar_on(EMPTY_J).sum(dim=1), check=equal(np.zeros((10, 1)))),
    Case(
        "M0_min_inf", lambda: scalar_on(EMPTY_J).min(dim=1), check=equal(np.full((10, 1), np.inf))
    ),
    Case(
        "M0_argmin_minus1",
        lambda: scalar_on(EMPTY_J).argmin(dim=1),
        check=equal(np.full((10, 1), -1)),
    ),
    Case(
        "M0_max_argmax",
        lambda: scalar_on(EMPTY_J).max_argmax(dim=1),
        check=lambda r: (equal(np.full((10, 1), -np.inf))(r[0]), equal(np.full((10, 1), -1))(r[1])),
    ),
    Case(
        "M0_logsumexp_minus_inf",
        lambda: scalar_on(EMPTY_J).logsumexp(dim=1),
        check=equal(np.full((10, 1), -np.inf)),
    ),
    Case("M0_sumsoftmaxweight_nan", _sumsoftmax_empty, check=equal(np.full((10, 2), np.nan))),
    Case(
        "M0_argKmin_K_too_large",
        lambda: scalar_on(EMPTY_J).argKmin(1, dim=1),
        ValueError,
        ("K=1", "larger than the number of reduced points (0)"),
    ),
    Case(
        "N0_reduced_over_i",
        lambda: (Vi(np.zeros((0, 1))) * Vj(Y1)).min(dim=0),
        check=equal(np.full((20, 1), np.inf)),
    ),
    Case(
        "batch_size_0",
        lambda: (LazyTensor(np.zeros((0, 10, 1, 1))) * LazyTensor(np.zeros((0, 1, 20, 1)))).sum(
            dim=2
        ),
        check=shape((0, 10, 1)),
    ),
    Case("M0_torch_grad_is_zero", _torch_empty_grad, check=equal(np.zeros((10, 1)))),
    # ------------------------------------------------------- NaN and inf
    Case("nan_sum", lambda: (Vi(X1) * Vj(Y_NAN)).sum(dim=1), check=equal(np.full((10, 1), np.nan))),
    Case(
        "nan_in_one_row_only",
        lambda: (Vi(_with_nan(X1, [3])) * Vj(Y1)).sum(dim=1),
        check=lambda r: np.testing.assert_array_equal(np.isnan(r[:, 0]), np.arange(10) == 3),
    ),
    Case("nan_min", lambda: (Vi(X1) * Vj(Y_NAN)).min(dim=1), check=equal(np.full((10, 1), np.nan))),
    Case(
        "nan_argmin_first_nan",
        lambda: (Vi(X1) * Vj(Y_NAN)).argmin(dim=1),
        check=equal(np.full((10, 1), 5)),
    ),
    Case(
        "nan_argmax_first_nan",
        lambda: (Vi(X1) * Vj(Y_NAN)).argmax(dim=1),
        check=equal(np.full((10, 1), 5)),
    ),
    Case(
        "nan_kmin_last",
        lambda: (Vi(X1) * Vj(Y_NAN)).Kmin(20, dim=1),
        check=equal(_nan_kmin_expected()),
    ),
    Case(
        "nan_argkmin_last_in_index_order",
        lambda: (Vi(X1) * Vj(Y_NAN)).argKmin(20, dim=1)[:, -2:],
        check=equal(np.tile([5, 7], (10, 1))),
    ),
    Case(
        "inf_minus_inf_sum_nan",
        lambda: (Vi(X_POS) * Vj(Y_INF)).sum(dim=1),
        check=equal(np.full((10, 1), np.nan)),
    ),
    Case(
        "pos_inf_sum",
        lambda: (Vi(X_POS) * Vj(Y_POS_INF)).sum(dim=1),
        check=equal(np.full((10, 1), np.inf)),
    ),
    Case(
        "minus_inf_min",
        lambda: (Vi(X_POS) * Vj(Y_INF)).min(dim=1),
        check=equal(np.full((10, 1), -np.inf)),
    ),
    Case(
        "minus_inf_argmin",
        lambda: (Vi(X_POS) * Vj(Y_INF)).argmin(dim=1),
        check=equal(np.full((10, 1), 6)),
    ),
    Case(
        "pos_inf_logsumexp",
        lambda: (Vi(X_POS) * Vj(Y_POS_INF)).logsumexp(dim=1),
        check=equal(np.full((10, 1), np.inf)),
    ),
    Case(
        "all_minus_inf_logsumexp",
        lambda: (Vi(X_POS) * Vj(np.full((20, 1), -np.inf))).logsumexp(dim=1),
        check=equal(np.full((10, 1), -np.inf)),
    ),
    Case(
        "nan_logsumexp",
        lambda: (Vi(X1) * Vj(Y_NAN)).logsumexp(dim=1),
        check=equal(np.full((10, 1), np.nan)),
    ),
    # ------------------------------------------------------- K of the K-min reductions
    Case(
        "K_larger_than_M",
        lambda: dot().argKmin(21, dim=1),
        ValueError,
        ("argkmin", "K=21", "number of reduced points (20)"),
    ),
    Case("K_larger_than_N_over_i", lambda: dot().Kmin(11, dim=0), ValueError, ("K=11", "(10)")),
    Case(
        "K_zero",
        lambda: dot().argKmin(0, dim=1),
        ValueError,
        ("K must be a positive integer", "got 0"),
    ),
    Case(
        "K_negative", lambda: dot().Kmin_argKmin(-2, dim=1), ValueError, ("positive integer", "-2")
    ),
    Case("K_float", lambda: dot().argKmin(2.5, dim=1), ValueError, ("positive integer", "2.5")),
    Case("K_bool", lambda: dot().argKmin(True, dim=1), ValueError, ("positive integer", "True")),
    Case("K_string", lambda: dot().argKmin("3", dim=1), ValueError, ("positive integer", "'3'")),
    Case(
        "K_numpy_integer",
        lambda: dot().argKmin(np.int64(3), dim=1),
        check=equal(np.argsort(dense_dot(), axis=1, kind="stable")[:, :3]),
    ),
    # ------------------------------------------------------- memory layouts
    Case(
        "negative_strides_numpy",
        lambda: (Vi(X[::-1]) * Vj(Y[::-2])).sum(-1).sum(dim=1),
        check=close(dense_dot(X[::-1], Y[::-2]).sum(1, keepdims=True)),
    ),
    Case(
        "fortran_order",
        lambda: (Vi(np.asfortranarray(X)) * Vj(Y.T.copy().T)).sum(-1).sum(dim=1),
        check=close(dense_dot().sum(1, keepdims=True)),
    ),
    Case(
        "zero_stride_broadcast_view",
        lambda: (Vi(X) * Vj(np.broadcast_to(Y[0], (20, 3)))).sum(-1).sum(dim=1),
        check=close(dense_dot(X, np.broadcast_to(Y[0], (20, 3))).sum(1, keepdims=True)),
    ),
    Case(
        "column_slice_view",
        lambda: (Vi(np.ascontiguousarray(X)[:, 1:]) * Vj(Y[:, :2])).sum(-1).sum(dim=1),
        check=close(dense_dot(X[:, 1:], Y[:, :2]).sum(1, keepdims=True)),
    ),
    Case(
        "torch_transposed_and_strided",
        lambda: (
            (Vi(torch.tensor(X.T.copy()).t()) * Vj(torch.tensor(Y)[::2])).sum(-1).sum(dim=1).numpy()
        ),
        check=close(dense_dot(X, Y[::2]).sum(1, keepdims=True)),
    ),
    Case(
        "batched_strided_view",
        lambda: (
            (LazyTensor(np.stack([X, X])[:, ::-1, None, :]) * LazyTensor(Y[None, None, :, :]))
            .sum(-1)
            .sum(dim=2)
        ),
        check=close(np.stack([dense_dot(X[::-1])] * 2).sum(2, keepdims=True)),
    ),
    # ------------------------------------------------------- options and backends
    Case("sum_unknown_option", lambda: dot().sum(dim=1, foo=1), TypeError, ("sum()", "'foo'")),
    Case("min_unknown_keyword", lambda: dot().min(dim=1, foo=1), TypeError, ("min()", "'foo'")),
    Case("argKmin_unknown_keyword", lambda: dot().argKmin(2, dim=1, foo=1), TypeError, ("'foo'",)),
    Case(  # pykeops: only sum-type reductions accumulate
        "argKmin_sum_scheme",
        lambda: dot().argKmin(2, dim=1, sum_scheme="kahan_scheme"),
        ValueError,
        ("sum_scheme='kahan_scheme'", "sum-type", "argkmin"),
    ),
    Case(
        "min_dtype_acc",
        lambda: dot().min(dim=1, dtype_acc="float64"),
        ValueError,
        ("dtype_acc='float64'", "sum-type", "min"),
    ),
    Case(
        "double_acc_twice",
        lambda: dot().sum(dim=1, dtype_acc="float32", use_double_acc=True),
        ValueError,
        ("use_double_acc", "dtype_acc='float32'"),
    ),
    Case(
        "bad_sum_scheme",
        lambda: dot().sum(dim=1, sum_scheme="pairwise"),
        ValueError,
        ("sum_scheme", "'pairwise'", "direct_sum", "block_sum", "kahan_scheme"),
    ),
    Case(
        "bad_dtype_acc",
        lambda: dot().sum(dim=1, dtype_acc="float16"),
        ValueError,
        ("dtype_acc", "'float16'"),
    ),
    Case(
        "unknown_backend",
        lambda: dot().sum(dim=1, backend="tpu"),
        ValueError,
        ("'tpu'", "'auto'", "'cpu'"),
    ),
    Case(
        "cuda_backend_on_cpu_tensors",
        lambda: (Vi(torch.from_numpy(X)) * Vj(torch.from_numpy(Y))).sum(-1).sum(dim=1,
                                                                              backend="cuda"),
        ValueError, ("cuda",)
    ),
    # ------------------------------------------------------- reduction dims
    Case("dim_3_unbatched", lambda: dot().sum(dim=3), ValueError, ("dim=3", "dim=0", "dim=1")),
    Case("dim_string", lambda: dot().min(dim="x"), ValueError, ("dim must be an integer", "'x'")),
    # sum() alone is the vector sum (pykeops's default dim=-1); with options, a reduction
    Case("dim_missing", lambda: dot().sum(backend="cpu"), ValueError, ("dim=0", "dim=1")),
    Case("dim_missing_reduction", lambda: dot().sum_reduction(), ValueError, ("dim=0", "dim=1")),
    Case("dim_float", lambda: dot().argmin(dim=1.0), ValueError, ("dim must be an integer", "1.0")),
    Case(
        "dim_and_axis_disagree", lambda: dot().sum(dim=1, axis=0), ValueError, ("dim=1", "axis=0")
    ),
    Case(
        "dim_minus_1_is_symbolic",
        lambda: (Vi(X) * Vj(Y)).min(dim=-1),
        check=lambda r: isinstance(r, LazyTensor),
    ),
    Case(
        "dim_2_of_batched_is_j",
        lambda: (LazyTensor(X[None, :, None, :]) * LazyTensor(Y[None, None])).sum(-1).sum(dim=2),
        check=close(dense_dot().sum(1, keepdims=True)[None]),
    ),
    # ------------------------------------------------------- constructors
    Case(
        "2d_without_axis", lambda: LazyTensor(X), ValueError, ("2D", "(10, 3)", "axis=0", "axis=1")
    ),
    Case(
        "axis_3",
        lambda: LazyTensor(X, axis=3),
        ValueError,
        ("axis must be 0 (i), 1 (j) or 2", "got 3"),
    ),
    Case("axis_bool", lambda: LazyTensor(X, axis=True), ValueError, ("axis", "True")),
    Case("axis_string", lambda: LazyTensor(X, axis="i"), ValueError, ("axis", "'i'")),
    Case("Vi_of_3d", lambda: Vi(np.ones((2, 3, 4))), ValueError, ("axis=0", "2D", "(2, 3, 4)")),
    Case("Pm_of_2d", lambda: Pm(X), ValueError, ("parameter", "1D", "(10, 3)")),
    Case(
        "shape_N_M_D",
        lambda: LazyTensor(np.ones((10, 20, 3))),
        ValueError,
        ("(10, 20, 3)", "(N, 1, D)", "(1, M, D)"),
    ),
    Case("of_string", lambda: LazyTensor("abc"), TypeError, ("str",)),
    Case("of_none", lambda: LazyTensor(None), TypeError, ("NoneType",)),
    Case("of_bool", lambda: LazyTensor(True), TypeError, ("bool",)),
    Case(
        "formula_without_variables",
        lambda: (LazyTensor(2) * 3).sum(dim=1),
        ValueError,
        ("sum", "has no variables", "Vi"),
    ),
    Case("vector_index_out_of_range", lambda: Vi(X)[5], IndexError, ("5", "dimension 3")),
    # ------------------------------------------------------- vector formulas
    Case(
        "argKmin_of_vector_formula_per_component",
        lambda: (Vi(X) - Vj(Y)).argKmin(2, dim=1),
        check=equal(np.argsort(X[:, None, :] - Y[None], axis=1, kind="stable")[:, :2, :]),
    ),
    Case(
        "min_of_vector_formula_per_component",
        lambda: (Vi(X) - Vj(Y)).min(dim=1),
        check=close((X[:, None, :] - Y[None]).min(1)),
    ),
    Case(
        "logsumexp_of_vector_formula",
        lambda: (Vi(X) - Vj(Y)).logsumexp(dim=1),
        ValueError,
        ("logsumexp", "scalar", "dimension 3"),
    ),
    Case(
        "sumsoftmaxweight_of_vector_formula",
        lambda: (Vi(X) - Vj(Y)).sumsoftmaxweight(Vj(B), dim=1),
        ValueError,
        ("scalar",),
    ),
    # ------------------------------------------------------- large formulas
    Case("deep_chain_600", _deep_chain, check=_pair_close),
    Case(
        "too_large_for_the_stack_sum",
        lambda: (Vi(np.ones((2, 100_000))) * Vj(np.ones((3, 100_000)))).sum(dim=1),
        ValueError,
        ("formula too large", "sum", "dimension 100000", "MB of stack"),
    ),
    Case(
        "too_large_for_the_stack_Kmin",
        lambda: (Vi(np.ones((2, 10_000))) - Vj(np.ones((70, 10_000)))).Kmin(60, dim=1),
        ValueError,
        ("formula too large", "K=60", "dimension 10000"),
    ),
    Case("shared_dag_40_levels", _shared_dag, check=lambda proc: _exited_ok(proc)),
]


def _param(case: Case):
    return pytest.param(case, id=case.id, marks=case.marks)


def test_table_is_large_and_ids_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_case(case: Case):
    if case.raises is not None:
        with pytest.raises(case.raises) as info:
            case.run()
        message = str(info.value)
        missing = [s for s in case.names if s not in message]
        assert not missing, f"message lacks {missing}: {message}"
    else:
        with np.errstate(all="ignore"):
            result = case.run()
        case.check(result)


def test_each_library_error_names_the_culprit_once_more():
    """The message of a dtype error names the argument position, so that a formula
    with several arrays of one shape still tells which one is wrong."""
    with pytest.raises(TypeError) as info:
        (Vi(X) * Vj(Y) * Vj(Y.astype(np.int32))).sum(-1).sum(dim=1)
    assert "argument 2" in str(info.value) and "int32" in str(info.value)
