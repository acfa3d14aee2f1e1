"""Instruction counts and CPU times of the CPU kernels a workload builds, outside Python.

``python -m tools.kernel_count CASE [--n N] [--m M] [--march ARCH] [--callgrind]`` runs a
small workload (the cases below), captures the kernels it builds (their generated C++
and their variables), and for each one compiles a standalone driver that calls ``lt_run``
on random data with one thread: it prints the thread's CPU time per call (median of
repeats: steadier than wall time on a loaded machine) and, with ``--callgrind``, the
instructions ``lt_run`` executes (valgrind; exact and repeatable, but valgrind 3.19 has
no AVX-512, so the driver is built for ``--march x86-64-v3`` by default). The figures
compare kernels with each other (forward against fused forward), not against torch.

>>> sorted(CASES)[:2]
['gate3', 'gauss3']
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from lazytensor import LazyTensor
from lazytensor.core import kernels


def _gauss(x, y, b, s, mode):
    K = (-LazyTensor(x[:, None]).sqdist(LazyTensor(y[None]))).exp() * LazyTensor(b[None])
    return K.sum(1, grad_mode=mode)


def _gauss_sigma(x, y, b, s, mode):
    """The bench's gradient case: exp(-|x - y|² / σ²) @ b."""
    from lazytensor import Pm, Vi, Vj

    K = (-Vi(x).sqdist(Vj(y)) / Pm(s * s)).exp()
    return (K * Vj(b)).sum(1, grad_mode=mode)


def _gate(x, y, b, s, mode):
    xi, yj = LazyTensor(x[:, None]), LazyTensor(y[None])
    z, u = (xi * yj).sum(-1), (xi - yj).sum(-1)
    return ((z - 0.5).ifelse(u.sigmoid(), u.tanh()) * LazyTensor(b[None])).sum(1, grad_mode=mode)


# name: (D, formula, which of x, y, s require grad)
CASES = {
    "gauss3": (3, _gauss, "x"), "gauss64": (64, _gauss, "x"),
    "gauss3-xys": (3, _gauss_sigma, "xys"), "gauss64-xys": (64, _gauss_sigma, "xys"),
    "gate3": (3, _gate, "x"),
}


def capture(case: str, dtype: torch.dtype, modes=("dual", "symbolic")) -> list:
    """(spec, source) of the kernels the case's forward and its gradients build."""
    D, run, grads = CASES[case]
    seen = []
    original = kernels.kernel_binary

    def spy(backend, spec):
        if backend.name == "cpu":
            # a two-sided gradient kernel: outputs of F_i rows N and F_j rows M
            sides = backend.key_extra.get("two_sided") and tuple(
                a.dim for a in spec.formula.args)
            seen.append((spec, backend.render(spec), sides))
        return original(backend, spec)

    import lazytensor.backends.cpu.runtime as rt

    kernels.kernel_binary = rt.kernel_binary = spy  # lazytensor.backends.cpu.backward reads kernels'.
    try:
        data = [torch.rand(300, D, dtype=dtype), torch.rand(310, D, dtype=dtype),
                torch.randn(310, 1, dtype=dtype), torch.tensor([0.5], dtype=dtype)]
        with torch.no_grad():
            run(data[0], data[1], data[2], data[3], "symbolic")
        for mode in modes:
            leaves = [v.clone().requires_grad_(name in grads)
                      for v, name in zip(data[:2] + data[3:], "xys")]
            x, y, s = leaves
            run(x, y, data[2], s, mode).sum().backward()
    finally:
        kernels.kernel_binary = rt.kernel_binary = original
    return seen


_DRIVER = r"""
#include <time.h>
#include <stdio.h>
#include <vector>
#include <algorithm>
static double lt_cpu_now() {
  timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
int main(int argc, char** argv) {
  const int64_t N = atoll(argv[1]), M = atoll(argv[2]); const int reps = atoi(argv[3]);
  const int64_t dims[] = {@DIMS@}; const char cats[] = "@CATS@"; const int64_t odims[] = {@ODIMS@};
  const char ocats[] = "@OCATS@";
  const int nv = sizeof(dims) / sizeof(dims[0]), no = sizeof(odims) / sizeof(odims[0]);
  std::vector<std::vector<T> > data(nv); std::vector<std::vector<double> > out(no);
  const int H = LT_HEADER;  // header words (see the kernel's calling convention)
  std::vector<int64_t> args(H + nv + no);
  int64_t one = 1; int stop = 0; args[0] = N; args[1] = M; args[2] = 0; args[3] = 1; args[4] = 0;
  args[5] = args[6] = args[7] = (int64_t)(intptr_t)&one;
  args[8] = -1; args[9] = args[10] = 0; args[11] = (int64_t)(intptr_t)&stop;
  unsigned s = 12345;
  for (int v = 0; v < nv; ++v) {
    const int64_t rows = cats[v] == 'i' ? N : cats[v] == 'j' ? M : 1;
    data[v].resize(rows * dims[v]);
    for (auto& e : data[v]) { s = s * 1664525u + 1013904223u; e = (T)((s >> 8) * (1.0 / 16777216.0) - 0.5); }
    args[H + v] = (int64_t)(intptr_t)data[v].data();
  }
  for (int o = 0; o < no; ++o) { out[o].resize((ocats[o] == 'j' ? M : N) * odims[o]); args[H + nv + o] = (int64_t)(intptr_t)out[o].data(); }
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) { const double t0 = lt_cpu_now(); lt_run(args.data()); t.push_back(lt_cpu_now() - t0); }
  std::sort(t.begin(), t.end());
  printf("%.6f\n", t[t.size() / 2]);
  return 0;
}
"""


def build_driver(spec, source: str, workdir: Path, march: str, flags: tuple = (),
                 sides: tuple | None = None) -> Path:
    """A standalone program that times ``lt_run`` (``sides``: the output dimensions of a
    two-sided gradient kernel, rows N and M)."""
    from lazytensor.codegen import reductions

    specs = sorted(spec.var_specs, key=lambda v: v.index)
    odims = list(sides) if sides else [
        o.dim for o in reductions.get(spec.reduction).outputs(spec.formula.dim, spec.opts_dict)]
    driver = (_DRIVER.replace("@DIMS@", ", ".join(str(v.dim) for v in specs))
              .replace("@CATS@", "".join(v.cat for v in specs))
              .replace("@ODIMS@", ", ".join(str(d) for d in odims))
              .replace("@OCATS@", "ij" if sides else "i" * len(odims)))
    src = workdir / "k.cpp"
    src.write_text(source + driver)
    exe = workdir / "k"
    from lazytensor.codegen.compilers import CpuCompiler

    base = [f for f in CpuCompiler.FLAGS if f not in ("-march=native", "-shared", "-fPIC")]
    subprocess.run(["g++", *base, f"-march={march}", "-g", *flags, str(src), "-o", str(exe),
                    "-lm"], check=True)
    return exe


def callgrind(exe: Path, N: int, M: int) -> int:
    """Instructions executed inside ``lt_run`` (one call)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                        "--toggle-collect=lt_run", str(exe), str(N), str(M), "1"],
                       check=True, capture_output=True)
        text = out.read_text()
    m = re.search(r"^summary:\s+(\d+)", text, re.M) or re.search(r"^totals:\s+(\d+)", text, re.M)
    return int(m.group(1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--modes", default="dual,symbolic", help="grad modes to capture")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--m", type=int, default=0, help="default: N")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--march", default="x86-64-v3")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--cxxflags", default="", help="more compiler flags")
    ap.add_argument("--keep", help="folder where the drivers' sources are kept")
    args = ap.parse_args(argv)
    M = args.m or args.n
    os.environ.setdefault("LAZYTENSOR_NUM_THREADS", "1")
    found = capture(args.case, getattr(torch, args.dtype), tuple(args.modes.split(",")))
    print(f"{args.case}, N = {args.n}, M = {M}, {args.dtype}, -march={args.march}, 1 thread")
    for n, (spec, source, sides) in enumerate(found):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(args.keep) / f"k{n}" if args.keep else Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            exe = build_driver(spec, source, work, args.march, tuple(args.cxxflags.split()), sides)
            t = float(subprocess.run([str(exe), str(args.n), str(M), str(args.reps)], check=True,
                                     capture_output=True, text=True).stdout)
            what = "two-sided" if sides else spec.reduction
            line = f"  [{n}] {what:10s} F={spec.formula.dim:<3d} cpu {t * 1e3:9.2f} ms"
            if args.callgrind:
                line += f"  {callgrind(exe, args.n, M) / 1e6:10.1f} M instr"
            print(line + f"  {str(spec.formula.key)[:8]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
