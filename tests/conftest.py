"""Test configuration.

- One private temporary directory per test session holds everything the tests create
  (``tempfile`` and ``$TMPDIR`` point to it, so subprocesses and compilers use it too):
  the kernel cache, unless ``$LAZYTENSOR_CACHE_DIR`` is given, and every temporary file.
  It is removed when the session ends. Under pytest-xdist (``make test`` runs ``-n 2``)
  the process that starts the workers imports this file first: the workers inherit its
  ``$TMPDIR`` and ``$LAZYTENSOR_CACHE_DIR``, so they share one kernel cache (safe across
  processes: each entry is built once, under a per-key lock) and each makes its own
  directory inside that one. Tests that need a cache of their own set
  ``$LAZYTENSOR_CACHE_DIR`` to a directory under ``tmp_path`` (per test and per worker).
- ``rng``: a fresh random generator per test, its seed printed on failure; a list of seeds
  from ``$LAZYTENSOR_TEST_SEEDS`` instead, and the soak run (``make soak``): tests/soak.py.
- ``gpu``: the real GPU when torch sees one, else the CUDA emulator (tests/cuda_emulator).
- What the CUDA tests reduce (``gpu_reduction``) and how they compare a GPU's results
  with the CPU backend's (``assert_gpu_close``).
- Block-sparse patterns (``random_ranges``, ``clustered_pattern``) and their dense oracle
  (``expected``), for the ranges tests of every backend.
- A one-line summary of the skipped tests, grouped by reason.
"""

import atexit
import os
import shutil
import tempfile
from collections import Counter

import numpy as np
import pytest
import soak

soak.draw_soak_seeds()  # before the workers start: they inherit the seeds
_SESSION_TMP = tempfile.mkdtemp(prefix="lazytensor-tests-")
_CREATOR = os.getpid()
tempfile.tempdir = _SESSION_TMP
os.environ["TMPDIR"] = _SESSION_TMP
if not os.environ.get("LAZYTENSOR_CACHE_DIR"):
    os.environ["LAZYTENSOR_CACHE_DIR"] = os.path.join(_SESSION_TMP, "kernel-cache")


def _remove_session_tmp():
    if os.getpid() == _CREATOR:  # not in a forked child that exits normally
        shutil.rmtree(_SESSION_TMP, ignore_errors=True)


atexit.register(_remove_session_tmp)


def pytest_configure(config):
    config.pluginmanager.register(soak.SoakPlugin(), "lazytensor-seeds")


@pytest.fixture
def rng(request):
    """A fresh random generator per test (or one per seed of ``$LAZYTENSOR_TEST_SEEDS``);
    the seed is printed on failure."""
    seed = getattr(request, "param", None)
    if seed is None:
        seed = soak.fresh_seed()
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ").strip()


def pytest_terminal_summary(terminalreporter):
    """``skipped N: n1 × reason (files), ...`` on one line (``-q`` hides the reasons)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts, files = Counter(), {}
    for report in skipped:
        reason = _skip_reason(report)
        counts[reason] += 1
        files.setdefault(reason, set()).add(os.path.basename(report.location[0]))
    groups = []
    for reason, n in counts.most_common():
        where = sorted(files[reason])
        where_text = ", ".join(where[:3]) + (f" +{len(where) - 3}" if len(where) > 3 else "")
        groups.append(f"{n} × {reason} ({where_text})")
    terminalreporter.write_line(f"skipped {len(skipped)}: " + "; ".join(groups))


def _gpu_kind():
    """("hardware" | "emulator", None) or (None, why not)."""
    import torch
    from lazytensor.codegen.cuda.nvcc import nvcc_path

    if nvcc_path() is None:
        return None, "nvcc not found (CUDA toolkit): CUDA kernels can be neither built nor run"
    if torch.cuda.is_available() and os.environ.get("LAZYTENSOR_TEST_GPU") != "emulator":
        return "hardware", None
    try:
        import pycuda  # noqa: F401
    except ImportError:
        return None, "pycuda is not installed (`make .venv/.pycuda` builds it against the " \
                     "fake driver)"
    return "emulator", None


@pytest.fixture(scope="session")
def _gpu_device():
    kind, why = _gpu_kind()
    if kind is None:
        pytest.skip(why)
    if kind == "hardware":
        from cuda_emulator.gpu import Gpu

        return Gpu()
    from cuda_emulator.gpu import EmulatedGpu

    return EmulatedGpu()


@pytest.fixture
def gpu(_gpu_device, monkeypatch):
    """A GPU: the real one when torch sees one, else the emulator (see tests/cuda_emulator).
    After the test, races or divergent barriers the emulator saw fail it."""
    if _gpu_device.emulated:
        _gpu_device.install(monkeypatch)
    yield _gpu_device
    _gpu_device.check()


class ChildError(Exception):
    """An exception raised by ``fn`` in :func:`run_in_child`: ``kind`` is its type's name."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


def run_in_child(fn, timeout: float = 300.0):
    """``fn()`` in a forked child: its (picklable) result; an exception it raised comes back
    as :class:`ChildError`. A child killed by a signal (a segfault, a stack overflow) fails
    the calling test instead of ending the test run."""
    import pickle
    import select
    import signal
    import time

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 0
        try:
            os.close(read_end)
            try:
                payload = ("returned", fn())
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                payload = ("raised", type(e).__name__, str(e))
            with os.fdopen(write_end, "wb") as f:
                f.write(pickle.dumps(payload))
        except BaseException:  # noqa: BLE001
            code = 3
        finally:
            os._exit(code)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(read_end, "rb") as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([f], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"the child did not finish within {timeout} s")
            data = os.read(f.fileno(), 1 << 20)
            if not data:
                break
            chunks.append(data)
    status = os.waitid(os.P_PID, pid, os.WEXITED)
    if status.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        raise AssertionError(f"the child was killed by {signal.Signals(status.si_status).name}")
    if status.si_status != 0 or not chunks:
        raise AssertionError(f"the child exited with status {status.si_status}")
    payload = pickle.loads(b"".join(chunks))
    if payload[0] == "raised":
        raise ChildError(payload[1], payload[2])
    return payload[1]


# ---------------------------------------------------------------- CUDA results

GPU_REDUCTIONS = ["sum", "logsumexp", "logsumexp_weight", "sumsoftmaxweight", "min", "max",
                  "argmin", "argmax", "min_argmin", "max_argmax", "kmin", "argkmin",
                  "kmin_argkmin"]
GPU_RTOL = {"float32": 1e-4, "float64": 1e-10}


def gpu_reduction(name: str, x, y, b, backend: str, **opts):
    """Reduction ``name`` (dim=1) of a Gaussian-like formula of torch tensors x (N, D),
    y (M, D), b (M, E); ``opts`` (``ranges=...``) go to the reduction."""
    from lazytensor import Vi, Vj

    opts = {"dim": 1, "backend": backend, **opts}
    d2 = Vi(x).sqdist(Vj(y))
    if name == "sum":
        return ((-d2).exp() * Vj(b)).sum(**opts)
    if name == "logsumexp":
        return (-d2).logsumexp(**opts)
    if name == "logsumexp_weight":
        return (-d2).logsumexp(weight=Vj(b.abs()), **opts)
    if name == "sumsoftmaxweight":
        return (-d2).sumsoftmaxweight(Vj(b), **opts)
    if name in ("min", "max", "argmin", "argmax", "min_argmin", "max_argmax"):
        return getattr(d2, name)(**opts)
    if name in ("kmin", "argkmin", "kmin_argkmin"):
        fn = {"kmin": "Kmin", "argkmin": "argKmin", "kmin_argkmin": "Kmin_argKmin"}[name]
        return getattr(d2, fn)(5, **opts)
    raise AssertionError(name)


def assert_gpu_close(gpu, got, want, dtype, x=None, y=None) -> None:
    """``got`` (on ``gpu``) against ``want`` (CPU): same dtypes and shapes, NaN and
    infinities in the same places, finite values within GPU_RTOL of the largest; indices
    equal in float64, in float32 (near-ties) pointing to the same squared distances of x
    and y (index -1 of an empty reduction included)."""
    import torch

    rtol = GPU_RTOL[str(dtype).replace("torch.", "")]
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert gpu.is_device(g) and g.dtype == w.dtype and g.shape == w.shape
        g = g.cpu()
        if w.dtype == torch.int64:
            if rtol < 1e-6:
                assert torch.equal(g, w)
            else:
                assert torch.equal(g < 0, w < 0)
                d_g = ((x[:, None, :] - y[g.reshape(g.shape[0], -1)]) ** 2).sum(-1)
                d_w = ((x[:, None, :] - y[w.reshape(w.shape[0], -1)]) ** 2).sum(-1)
                assert torch.allclose(d_g, d_w, rtol=1e-4, atol=1e-5)
        else:
            assert torch.equal(g.isnan(), w.isnan())
            assert torch.equal(g.isinf(), w.isinf())
            assert torch.equal(g[g.isinf()], w[w.isinf()])
            finite = w.isfinite()
            if finite.any():
                g, w = g[finite], w[finite]
                scale = w.abs().max().clamp(min=1e-30)
                assert ((g - w).abs().max() / scale).item() <= rtol


# ---------------------------------------------------------------- block-sparse patterns


def random_ranges(rng, N: int, M: int, n_blocks: int = 6):
    """A forward-only pattern (the transposed half empty): blocks in random order with
    gaps, each with 0-4 intervals in random order, some repeated, some empty."""
    cuts = np.sort(rng.choice(np.arange(1, N), size=2 * n_blocks - 1, replace=False))
    edges = np.concatenate([[0], cuts, [N]])
    blocks = [(edges[2 * k], edges[2 * k + 1]) for k in range(n_blocks)]  # every other one
    blocks.append((edges[-2], edges[-1]))
    blocks = [blocks[k] for k in rng.permutation(len(blocks))]
    red, slices = [], []
    for _ in blocks:
        for _ in range(rng.integers(0, 5)):
            s = int(rng.integers(0, M))
            e = int(rng.integers(s, M + 1)) if rng.random() < 0.9 else s  # some empty
            red.append((s, e))
            if rng.random() < 0.2:
                red.append((s, e))  # repeated: counted twice
        slices.append(len(red))
    empty = np.zeros((0, 2), np.int64)
    return (np.array(blocks, np.int64).reshape(-1, 2), np.array(slices, np.int64),
            np.array(red, np.int64).reshape(-1, 2), empty, np.zeros(0, np.int64), empty)


def gathered(ranges, N: int):
    """{row range: global j indices in the order the block reduces them (repeats kept)}."""
    out = {}
    ranges_i, slices_i, red = ranges[:3]
    for k, (a, b) in enumerate(ranges_i):
        lo = slices_i[k - 1] if k else 0
        idx = [np.arange(s, e) for s, e in red[lo:slices_i[k]]]
        out[(int(a), int(b))] = np.concatenate(idx) if idx else np.zeros(0, np.int64)
    return out


def expected(values, ranges, reduction: str, K: int = 0):
    """Dense oracle: ``values`` (N, M, F) float64 reduced over each block's gathered j."""
    N, _, F = values.shape
    empty = {"sum": 0.0, "min": np.inf, "max": -np.inf, "kmin": np.inf, "lse": -np.inf}[reduction]
    width = K * F if reduction == "kmin" else F
    out = np.full((N, width), empty)
    idx_out = np.full((N, width), -1, np.int64)
    for (a, b), idx in gathered(ranges, N).items():
        v = values[a:b][:, idx]  # (rows, n, F)
        if len(idx) == 0:
            continue
        if reduction == "sum":
            out[a:b] = v.sum(1)
        elif reduction in ("min", "max"):
            pick = v.argmin(1) if reduction == "min" else v.argmax(1)
            out[a:b] = np.take_along_axis(v, pick[:, None], 1)[:, 0]
            idx_out[a:b] = idx[pick]
        elif reduction == "kmin":
            order = np.argsort(v, axis=1, kind="stable")[:, :K]  # (rows, <=K, F)
            n = order.shape[1]
            vals = np.take_along_axis(v, order, 1)
            for c in range(F):  # layout [K][F]
                out[a:b, c:n * F:F] = vals[:, :, c]
                idx_out[a:b, c:n * F:F] = idx[order[:, :, c]]
        else:
            m = v.max(1, keepdims=True)
            out[a:b] = (m + np.log(np.exp(v - m).sum(1, keepdims=True)))[:, 0]
    return out, idx_out


def clustered_pattern(rng, N, M, C=8):
    """Consistent ranges in both directions (from a random cluster-pair matrix)."""
    ci = np.sort(rng.choice(np.arange(1, N), C - 1, replace=False))
    cj = np.sort(rng.choice(np.arange(1, M), C - 1, replace=False))
    ri = np.stack([np.r_[0, ci], np.r_[ci, N]], 1)
    rj = np.stack([np.r_[0, cj], np.r_[cj, M]], 1)
    keep = rng.random((C, C)) < 0.4
    mask = np.repeat(np.repeat(keep, np.diff(ri, 1)[:, 0], 0), np.diff(rj, 1)[:, 0], 1)
    from lazytensor.scale.cluster import from_matrix

    return from_matrix(ri, rj, keep), mask
