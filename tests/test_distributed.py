"""Reductions over gloo process groups on loopback (torch.multiprocessing, spawn), against
one process on all the data: every reduction forward and backward, uneven shards (empty
ones too), both schemes (ring, all-gather), and ranks that fail, disagree, stall or die.

Each rank builds all the data from one seed, keeps its rows, and compares its results
with the one-process result on its rows; the ranks report to files that the test reads.
"""

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.distributed

TIMEOUT_S = 30  # the process groups' timeout: nothing in here may hang longer


# ----------------------------------------------------------------------- launching ranks


def launch(fn, world: int, *args, wait_s: float = 240) -> list:
    """Run ``fn(rank, world, report, *args)`` on ``world`` gloo ranks; each rank's report
    (a list of [check, ok, detail]) and exit code."""
    ctx = torch.multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_entry, args=(fn, rank, world, store, tmp, *args))
                 for rank in range(world)]
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"  # several ranks share two cores
        try:
            for p in procs:
                p.start()
        finally:
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS")
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        deadline = time.monotonic() + wait_s
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        reports = []
        for rank, p in enumerate(procs):
            path = os.path.join(tmp, f"rank{rank}.json")
            checks = json.load(open(path)) if os.path.exists(path) else []
            reports.append({"exitcode": p.exitcode, "checks": checks})
        return reports


def _entry(fn, rank, world, store, out_dir, *args):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    report = []
    try:
        fn(rank, world, report, *args)
    except BaseException:
        report.append(["worker", False, traceback.format_exc()])
    try:
        dist.destroy_process_group()
        report.append(_no_group_threads_left())
    except BaseException:
        report.append(["destroy_process_group", False, traceback.format_exc()])
    with open(os.path.join(out_dir, f"rank{rank}.json.tmp"), "w") as f:
        json.dump(report, f)
    os.replace(os.path.join(out_dir, f"rank{rank}.json.tmp"),
               os.path.join(out_dir, f"rank{rank}.json"))


# Threads of a gloo process group (its transport loop, its workers), by their names
GROUP_THREADS = ("gloo", "pt_gloo")


def _no_group_threads_left() -> list:
    """[check, ok, detail]: no thread of the process group runs after
    destroy_process_group. A group that something still holds is destroyed only during
    the interpreter's teardown, and its threads racing that teardown can abort the rank
    as it exits (``terminate called without an active exception``)."""
    if not os.path.isdir("/proc/self/task"):  # thread names are read from Linux's /proc
        return ["no thread of the process group left (not checked: no /proc)", True, ""]
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # a thread that ended meanwhile
            pass
    left = sorted(n for n in names if n.startswith(GROUP_THREADS))
    return ["no thread of the process group left after destroy_process_group", not left,
            f"still running: {left}" if left else ""]


def assert_all_ok(reports, world):
    bad = [f"rank {r}: {name}: {detail}" for r, rep in enumerate(reports)
           for name, ok, detail in rep["checks"] if not ok]
    assert not bad, "\n".join(bad)
    for r, rep in enumerate(reports):
        assert rep["exitcode"] == 0 and rep["checks"], f"rank {r} of {world}: {rep}"


def shard_sizes(rng, n, world, empty_rank=None):
    """Uneven positive sizes summing to n; rank ``empty_rank`` (if any) gets none."""
    parts = world - (empty_rank is not None)
    cuts = np.sort(rng.choice(np.arange(1, n), size=parts - 1, replace=False))
    sizes = np.diff([0, *cuts, n]).tolist()
    if empty_rank is not None:
        sizes.insert(empty_rank, 0)
    return sizes


def compare(report, name, got, want, rtol=1e-10):
    """Append [name, ok, detail]: float arrays to ``rtol`` of their scale, ints exactly."""
    got = [g.detach() if torch.is_tensor(g) else torch.from_numpy(np.asarray(g)) for g in got]
    want = [w.detach() if torch.is_tensor(w) else torch.from_numpy(np.asarray(w)) for w in want]
    for k, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            report.append([f"{name}[{k}]", False, f"{g.shape} {g.dtype} vs {w.shape} {w.dtype}"])
            return
        if not w.is_floating_point():
            ok = bool(torch.equal(g, w))
            detail = "" if ok else f"{(g != w).sum().item()} indices differ"
        else:
            finite = torch.isfinite(w)
            scale = w[finite].abs().max().item() if finite.any() else 1.0
            same_nonfinite = torch.equal(torch.isnan(g), torch.isnan(w)) and torch.equal(
                torch.where(finite, 0, g.nan_to_num(0)), torch.where(finite, 0, w.nan_to_num(0)))
            err = (g - w)[finite].abs().max().item() if finite.any() else 0.0
            ok = same_nonfinite and err <= rtol * max(scale, 1e-300)
            detail = "" if ok else f"max error {err:.3g} at scale {scale:.3g}"
        report.append([f"{name}[{k}]", ok, detail])


# ------------------------------------------------------------------ reductions vs one process


def _cases():
    """(label, reduce(x, y, b, p) -> outputs, differentiable)."""
    from lazytensor import Pm, Vi, Vj

    def D(x, y, p):
        return Vi(x).sqdist(Vj(y)) * Pm(p)

    def tup(r):
        return r if isinstance(r, tuple) else (r,)

    return [
        ("K @ b", lambda x, y, b, p: tup((-D(x, y, p)).exp() @ b), True),
        ("sum kahan", lambda x, y, b, p: tup(((-D(x, y, p)).exp() * Vj(b)).sum(
            dim=1, sum_scheme="kahan_scheme")), True),
        ("min", lambda x, y, b, p: tup(D(x, y, p).min(dim=1)), True),
        ("max", lambda x, y, b, p: tup(D(x, y, p).max(dim=1)), True),
        ("argmin", lambda x, y, b, p: tup(D(x, y, p).argmin(dim=1)), False),
        ("argmax", lambda x, y, b, p: tup(D(x, y, p).argmax(dim=1)), False),
        ("min_argmin", lambda x, y, b, p: tup(D(x, y, p).min_argmin(dim=1)), True),
        ("max_argmax", lambda x, y, b, p: tup(D(x, y, p).max_argmax(dim=1)), True),
        ("Kmin", lambda x, y, b, p: tup(D(x, y, p).Kmin(4, dim=1)), True),
        ("argKmin", lambda x, y, b, p: tup(D(x, y, p).argKmin(4, dim=1)), False),
        ("Kmin_argKmin", lambda x, y, b, p: tup(D(x, y, p).Kmin_argKmin(4, dim=1)), True),
        ("Kmin F=3", lambda x, y, b, p: tup((Vi(x) - Vj(y)).abs().Kmin(3, dim=1)), True),
        ("logsumexp", lambda x, y, b, p: tup((-D(x, y, p)).logsumexp(dim=1)), True),
        ("logsumexp weight", lambda x, y, b, p: tup((-D(x, y, p)).logsumexp(
            dim=1, weight=Vj(b + 3.0))), True),
        ("sumsoftmaxweight", lambda x, y, b, p: tup((-D(x, y, p)).sumsoftmaxweight(
            Vj(b), dim=1)), True),
        ("max_sumshiftexp", lambda x, y, b, p: tup((-D(x, y, p)).max_sumshiftexp(dim=1)), False),
        ("sum over i", lambda x, y, b, p: tup(((-D(x, y, p)).exp() * Vi(x)).sum(dim=0)), True),
        ("argmin over i", lambda x, y, b, p: tup(D(x, y, p).argmin(dim=0)), False),
    ]


def _reductions(rank, world, report, seed, modes):
    import lazytensor.distributed as ltd

    rng = np.random.default_rng(seed)
    N, M = 23, 31
    n_sizes = shard_sizes(rng, N, world, empty_rank=2 if world > 2 else None)
    m_sizes = shard_sizes(rng, M, world, empty_rank=1 if world > 2 else None)
    n0, m0 = sum(n_sizes[:rank]), sum(m_sizes[:rank])
    rows, cols = slice(n0, n0 + n_sizes[rank]), slice(m0, m0 + m_sizes[rank])
    data = [rng.random((N, 3)), rng.random((M, 3)), rng.standard_normal((M, 2)),
            np.array([1.0 + rng.random()])]
    for mode in modes:
        for label, run, differentiable in _cases():
            name = f"{label} ({mode}, N={n_sizes}, M={m_sizes})"
            full = [torch.tensor(a, requires_grad=differentiable) for a in data]
            want = run(*full)
            over_i = "over i" in label
            mine = cols if over_i else rows
            local = [torch.tensor(a[s], requires_grad=differentiable) for a, s in
                     zip(data, (rows, cols, cols, slice(None)))]
            with ltd.sharded(mode=mode):
                got = run(*local)
            compare(report, name, got, [w[mine] for w in want])
            if not differentiable:
                continue
            g_rng = np.random.default_rng(seed + 1)
            cots = [torch.tensor(g_rng.standard_normal(w.shape)) for w in want]
            pairs = [(w, c) for w, c in zip(want, cots) if w.is_floating_point()]
            wg = torch.autograd.grad([w for w, _ in pairs], full, [c for _, c in pairs],
                                     allow_unused=True)
            pairs = [(g, c[mine]) for g, c in zip(got, cots) if g.is_floating_point()]
            gg = torch.autograd.grad([g for g, _ in pairs], local, [c for _, c in pairs],
                                     allow_unused=True)
            for var, s, g, w in zip("xybp", (rows, cols, cols, slice(None)), gg, wg):
                if (g is None) != (w is None):
                    report.append([f"{name} grad {var}", False, f"{g} vs {w}"])
                elif g is not None:
                    compare(report, f"{name} grad {var}", [g], [w[s]], rtol=1e-9)
    _api_variants(rank, world, report, data, rows, cols)


def _api_variants(rank, world, report, data, rows, cols):
    """group= keyword, NumPy inputs, float32, one tensor as both i- and j-variable."""
    import torch.distributed as dist

    import lazytensor.distributed as ltd
    from lazytensor import Vi, Vj

    x, y, b, _ = data
    # a kernel on one point set: x's rows are both the output's and the reduced ones
    c = np.random.default_rng(len(x)).standard_normal((len(x), 1))
    full, mine = torch.tensor(x, requires_grad=True), torch.tensor(x[rows], requires_grad=True)
    want = (-Vi(full).sqdist(Vj(full))).exp() @ torch.from_numpy(c)
    with ltd.sharded(mode="ring"):
        got = (-Vi(mine).sqdist(Vj(mine))).exp() @ torch.from_numpy(c[rows])
    compare(report, "one point set on both sides", [got], [want[rows]])
    (want ** 2).sum().backward()
    (got ** 2).sum().backward()
    compare(report, "one point set on both sides: gradient", [mine.grad], [full.grad[rows]],
            rtol=1e-9)
    want = (-Vi(x).sqdist(Vj(y))).exp() @ b
    got = ((-Vi(x[rows]).sqdist(Vj(y[cols]))).exp() * Vj(b[cols])).sum(dim=1,
                                                                        group=dist.group.WORLD)
    compare(report, "group= keyword, NumPy in and out", [got], [want[rows]])
    report.append(["NumPy out", isinstance(got, np.ndarray), type(got).__name__])
    x32, y32, b32 = (torch.tensor(a, dtype=torch.float32) for a in (x, y, b))
    got = ((-Vi(x32[rows]).sqdist(Vj(y32[cols]))).exp() * Vj(b32[cols])).sum(
        dim=1, group=dist.group.WORLD)
    compare(report, "float32 sum (ring)", [got.double()], [torch.from_numpy(want[rows])], 1e-5)


def _reductions_then_faults(rank, world, report, seed):
    _reductions(rank, world, report, seed, ["ring", "allgather"])
    _faults(rank, world, report)  # last: it ends with a rank that never comes


def test_two_ranks_match_one_process_and_raise_together_on_faults(rng):
    """Both schemes, every reduction and gradient; then (one start-up of the ranks saved)
    formulas and dtypes that differ, a rank with bad inputs, a rank whose kernel fails,
    a rank that never comes."""
    assert_all_ok(launch(_reductions_then_faults, 2, int(rng.integers(1 << 30))), 2)


def test_four_uneven_ranks_match_one_process(rng):
    """The ring on 4 ranks, some with no rows of x or of y."""
    assert_all_ok(launch(_reductions, 4, int(rng.integers(1 << 30)), ["ring"]), 4)


# ------------------------------------------------------------------------------- faults


def _faults(rank, world, report):
    import lazytensor.distributed as ltd
    from lazytensor import Vi, Vj
    from lazytensor.scale import blocks

    rng = np.random.default_rng(7)
    x, y = rng.random((10, 3)), rng.random((12, 3))

    def expect_error(name, fn, *needles):
        try:
            fn()
        except ltd.DistributedReductionError as e:
            text = str(e)
            ok = all(n in text for n in needles)
            report.append([name, ok, "" if ok else text])
        except Exception as e:
            report.append([name, False, f"{type(e).__name__}: {e}"])
        else:
            report.append([name, False, "no error"])

    with ltd.sharded(mode="ring"):
        # a formula that differs on rank 1, then a dtype that does
        f = Vi(x).sqdist(Vj(y)) if rank == 0 else (Vi(x) - Vj(y)).abs().sum()
        expect_error("other formula", lambda: f.sum(dim=1), "do not make the same",
                     "rank 0:", "rank 1:")
        yy = y if rank == 0 else y.astype(np.float32)
        xx = x if rank == 0 else x.astype(np.float32)
        expect_error("other dtype", lambda: Vi(xx).sqdist(Vj(yy)).sum(dim=1),
                     "do not make the same", "float32")
        # a rank whose inputs are wrong: every rank names it and its error
        bad = Vj(np.ones((y.shape[0] + (rank == 1), 2)))
        expect_error("bad input on rank 1", lambda: (Vi(x).sqdist(Vj(y)) * bad).sum(dim=1),
                     "rank 1 failed before", "j-variable")
        # a rank whose kernel raises in the middle of the ring
        real = blocks.block_state
        calls = []

        def failing(*args, **kw):
            calls.append(1)
            if rank == 1 and len(calls) == 2:
                raise MemoryError("injected failure")
            return real(*args, **kw)

        blocks.block_state = failing
        try:
            expect_error("rank 1 fails mid-ring", lambda: Vi(x).sqdist(Vj(y)).argmin(dim=1),
                         "rank 1 failed during", "MemoryError: injected failure")
        finally:
            blocks.block_state = real
        # the group is still consistent afterwards
        got = Vi(x).sqdist(Vj(y)).argKmin(2, dim=1)
    want = Vi(np.tile(x, (world, 1))).sqdist(Vj(np.tile(y, (world, 1)))).argKmin(2, dim=1)
    compare(report, "after the failures", [got], [want[rank * 10: rank * 10 + 10]])
    # a rank that does not come: the others give up after the sharding's timeout
    if rank == 1:
        time.sleep(2.5)
        report.append(["late rank", True, ""])
        return
    start = time.monotonic()
    expect_error("a rank that never comes", lambda: Vi(x).sqdist(Vj(y)).sum(
        dim=1, group=ltd.Sharding(timeout=1.0)), "within the timeout")
    waited = time.monotonic() - start
    report.append(["timeout honoured", waited < 2.5, f"waited {waited:.1f} s"])


def _dying(rank, world, report, when):
    """Rank 1 dies in its kernel (after it started its ring transfers), or before the
    ring ("before the ring": rank 0 then starts its sends to a rank that is gone, which
    fails at once, not in the wait)."""
    import lazytensor.distributed as ltd
    from lazytensor import Vi, Vj
    from lazytensor.distributed import protocol
    from lazytensor.scale import blocks

    x, y = np.random.rand(10, 3), np.random.rand(12, 3)
    if when == "in its kernel" and rank == 1:
        blocks.block_state = lambda *a, **k: os._exit(3)
    if when == "before the ring":  # the ring broadcasts the parameters before its sends
        real = protocol.broadcast_tensors

        def broadcast(*args):
            if rank == 1:
                os._exit(3)
            time.sleep(1.5)  # rank 1 is gone, its connections closed
            return real(*args)

        protocol.broadcast_tensors = broadcast
    start = time.monotonic()
    try:
        Vi(x).sqdist(Vj(y)).sum(dim=1, group=ltd.Sharding(mode="ring", timeout=8))
        report.append(["peer died", False, "no error"])
    except ltd.DistributedReductionError as e:
        report.append(["peer died", "rank 0" in str(e), str(e)])
    limit = 9.0 + (1.5 if when == "before the ring" else 0.0)  # the timeout, and the sleep
    report.append(["no hang past the timeout", time.monotonic() - start < limit,
                   f"{time.monotonic() - start:.1f} s"])


@pytest.mark.parametrize("when", ["in its kernel", "before the ring"])
def test_a_rank_that_dies_makes_the_others_raise_within_the_timeout(when):
    reports = launch(_dying, 2, when, wait_s=60)
    assert reports[1]["exitcode"] == 3
    bad = [f"{name}: {detail}" for name, ok, detail in reports[0]["checks"] if not ok]
    assert reports[0]["checks"] and not bad, "\n".join(bad) or reports[0]


# ------------------------------------------------------------------- the end of a rank


GATHER_GRADIENTS = """
import sys
import torch
from lazytensor import Vi, Vj

x = torch.randn(40, 3, dtype=torch.float64, requires_grad=True)
y = torch.randn(50, 3, dtype=torch.float64, requires_grad=True)
d = Vi(x).sqdist(Vj(y))
loss = d.min(dim=1).sum() + d.max(dim=1).sum() + d.Kmin(3, dim=1).sum()
loss = loss + d.min_argmin(dim=1)[0].sum() + d.Kmin_argKmin(2, dim=1)[0].sum()
loss.backward()
print(sorted(m for m in ("torch._dynamo", "torch.distributed.nn") if m in sys.modules))
"""


def test_gather_gradients_leave_torch_dynamo_unimported(tmp_path):
    """The gradients of min, max and K-min (through their indices) import neither
    torch._dynamo nor, through it, torch.distributed.nn: its functions take the default
    process group as the default value of ``group``, so an import after init_process_group
    keeps the group (and its gloo threads) alive past destroy_process_group, into the
    interpreter's teardown, where a rank can abort as it exits."""
    done = subprocess.run([sys.executable, "-c", GATHER_GRADIENTS], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
