"""What NumPy and torch functions refuse on LazyTensors, with an error naming the function."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lazytensor import LazyTensor, Vi, Vj


def _kernels(rng, lib="numpy"):
    x, y = rng.random((6, 3)), rng.random((4, 3))
    if lib == "torch":
        x, y = torch.tensor(x), torch.tensor(y)
    d = Vi(x).sqdist(Vj(y))
    return d, Vi(x) - Vj(y)  # a scalar and a vector formula


@pytest.mark.parametrize("convert, what", [
    (np.asarray, "np.asarray"), (np.array, "np.array"),
    (torch.as_tensor, "torch.as_tensor"), (torch.tensor, "torch.tensor"), (len, "len(K)"),
])
def test_implicit_dense_conversions_refuse_with_the_size_and_dense(convert, what, rng):
    x, y = rng.random((1000, 3)).astype(np.float32), rng.random((2000, 3)).astype(np.float32)
    K = (-Vi(x).sqdist(Vj(y))).exp()
    with pytest.raises(TypeError) as e:
        convert(K)
    text = str(e.value)
    assert what in text and "shape (1000, 2000), float32: 7.6 MiB" in text
    assert "K.dense(max_bytes=...)" in text
    assert bool(K) is True  # still truthy, as any object


def _case(name, call, error=TypeError, also=""):
    return pytest.param(call, error, name, also, id=name + (f"-{also}" if also else ""))


REFUSED = [
    _case("numpy.remainder", lambda K, V, t: np.remainder(K, 2.0)),
    _case("numpy.cumsum", lambda K, V, t: np.cumsum(K)),
    _case("numpy.add.outer", lambda K, V, t: np.add.outer(K, K)),
    _case("numpy.maximum.reduce", lambda K, V, t: np.maximum.reduce(K)),
    _case("torch.cumsum", lambda K, V, t: torch.cumsum(K, 0)),
    _case("torch.Tensor.fmod", lambda K, V, t: torch.ones(6, 1, 1).fmod(K)),
    _case("numpy.exp", lambda K, V, t: np.exp(K, out=np.empty(3)), also="out="),
    _case("numpy.exp", lambda K, V, t: np.exp(K, where=np.ones(3, bool)), also="where="),
    _case("numpy.add", lambda K, V, t: np.add(np.ones((6, 1, 1)), K, out=np.ones((6, 1, 1))),
          also="out="),
    _case("numpy.exp", lambda K, V, t: np.exp(K, dtype=np.float32), also="dtype="),
    _case("numpy.sum", lambda K, V, t: np.sum(K, axis=1, out=np.empty(6)), also="out="),
    _case("numpy.sum", lambda K, V, t: np.sum(K, axis=1, dtype=np.float32), also="dtype="),
    _case("numpy.sum", lambda K, V, t: np.sum(K, axis=1, where=np.ones((6, 4), bool)),
          also="where="),
    _case("numpy.max", lambda K, V, t: np.max(K, axis=1, initial=0.0), also="initial="),
    _case("numpy.clip", lambda K, V, t: np.clip(K, 0, 1, out=np.empty(3)), also="out="),
    _case("torch.exp", lambda K, V, t: torch.exp(K, out=torch.empty(3)), also="out="),
    _case("torch.sum", lambda K, V, t: torch.sum(K, dim=1, dtype=torch.float32), also="dtype="),
    _case("torch.softmax", lambda K, V, t: torch.softmax(K, 1, dtype=torch.float32),
          also="dtype="),
    _case("numpy.argmin", lambda K, V, t: np.argmin(K), also="axis"),
    _case("torch.argmax", lambda K, V, t: torch.argmax(K), also="axis"),
    _case("numpy.sum", lambda K, V, t: np.sum(V, axis=-1, keepdims=True), also="keepdims"),
    _case("torch.softmax", lambda K, V, t: torch.softmax(V, dim=1), also="scalar formula"),
    _case("torch.logsumexp", lambda K, V, t: torch.logsumexp(V, dim=1), also="scalar formula"),
    _case("torch.nn.functional.log_softmax", lambda K, V, t: F.log_softmax(K), also="dim="),
    _case("numpy.matmul", lambda K, V, t: np.matmul(K, K), also="two LazyTensors"),
    _case("numpy.where", lambda K, V, t: np.where(K > 0), also="one-argument"),
    _case("torch.nn.functional.relu", lambda K, V, t: F.relu(K, inplace=True), also="inplace"),
    _case("numpy.linalg.norm", lambda K, V, t: np.linalg.norm(K, ord=1, axis=1), also="ord"),
    _case("numpy.linalg.norm", lambda K, V, t: np.linalg.norm(K, ord=2), also="ord"),
    _case("torch.norm", lambda K, V, t: torch.norm(K, p=1), also="ord"),
    _case("torch.clamp", lambda K, V, t: torch.clamp(K), also="bound"),
    _case("numpy.concatenate", lambda K, V, t: np.concatenate([V, V], -1, casting="no"),
          also="casting"),
    _case("numpy.round", lambda K, V, t: np.round(K, 0.5), also="decimals"),
    _case("numpy.sum", lambda K, V, t: np.sum(K, axis=2), ValueError, also="out of bounds"),
    _case("torch.topk", lambda K, V, t: torch.topk(V, 2, dim=-1), ValueError, also="vector axis"),
    _case("numpy.concatenate", lambda K, V, t: np.concatenate([V, V], axis=0), ValueError,
          also="vector dimension"),
    _case("torch.div", lambda K, V, t: torch.div(K, K, rounding_mode="up"), ValueError,
          also="rounding_mode"),
]


@pytest.mark.parametrize("call, error, name, also", REFUSED)
def test_refused_calls_name_the_function(call, error, name, also, rng):
    K, V = _kernels(rng, "numpy")
    Kt, Vt = _kernels(rng, "torch")
    is_torch = name.startswith("torch")
    with pytest.raises(error) as e:
        call(Kt if is_torch else K, Vt if is_torch else V, None)
    text = str(e.value)
    assert name in text and also.lower() in text.lower(), text


def test_reductions_over_batch_axes_only_and_dot_with_batches_refuse(rng):
    x, y = rng.random((2, 5, 1, 3)), rng.random((2, 1, 4, 3))
    K = (LazyTensor(x) - LazyTensor(y)).sqnorm2()  # shape (2, 5, 4)
    with pytest.raises(ValueError, match="batch axis"):
        np.sum(K, axis=0)
    with pytest.raises(ValueError, match="batch axis"):
        torch.argmin(K, dim=0)
    with pytest.raises(TypeError, match=re.escape("numpy.dot")):
        np.dot(K, rng.random((2, 4, 1)))
    assert np.sum(K, axis=(0, 2)).shape == (5,)  # with i or j, a batch axis reduces densely


def test_in_place_numpy_operator_says_how_to_write_it(rng):
    K, _ = _kernels(rng)
    a = np.ones((6, 1, 1))
    with pytest.raises(TypeError, match=re.escape("array = array + K")):
        a += K
    a = a + K
    assert isinstance(a, LazyTensor)


def test_an_unknown_array_type_is_left_to_its_own_library(rng):
    class Other:
        def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
            return "other"

        def __array_function__(self, func, types, args, kwargs):
            return "other"

    K, _ = _kernels(rng)
    assert np.add(K, Other()) == "other"
    assert np.concatenate([K, Other()]) == "other"
