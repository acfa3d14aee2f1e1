"""The limit of a pair loop on this machine: operations per pair of our generated inner
loop, read from its source, against the measured vector throughput.

The source is what ``LAZYTENSOR_DEBUG=1`` prints when a kernel is built (a child process
with an empty cache builds the workload's kernels). Per pair and vector lane it counts:

- the formula (its ``// formula:`` line, common subexpressions once): ``sub``/``add``/``neg``
  one "add" per component, ``mul`` one "fma", ``sum(mul(...))`` of D components D "fma"
  (a multiply, then D - 1 FMAs), ``exp`` the operations of the kernel's float ``lt_exp``
  (each statement: a multiply and an add make one FMA; selects are "add");
- the reduction: a sum's add (the kernels keep the last product and the add apart), a
  log-sum-exp's max, subtract, exp and add, an argKmin's compare;
- dot-product kernels (``lt_dot<D>``): D FMAs, and the distance from the dots (1 FMA,
  1 add, 1 compare).

Classes: "fma" (multiplies, FMAs) and "add" (adds, subtracts, negations, min/max, compares,
selects); shifts and loads are not counted. The floor: a pair takes at least
``max(fma / F, add / A, (fma + add) / X)`` seconds, F, A, X the measured rates of
independent FMAs, adds, and both mixed 1:1 (:meth:`ExpertLoops.rate`: one core, times
the threads).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = """
import torch
from lazytensor import Vi, Vj
torch.manual_seed(0)
N, D, kind = {N}, {D}, {kind!r}
x, y, b = torch.rand(N, D), torch.rand(N, D), torch.randn(N, 1)
if kind == "gauss":
    (-Vi(x).sqdist(Vj(y)) / 0.03).exp() @ b
elif kind == "knn":
    Vi(x).sqdist(Vj(y)).argKmin(10, dim=1)
elif kind == "lse":
    (-Vi(x).sqdist(Vj(y)) / 0.03).logsumexp(dim=1)
else:
    xs = x.clone().requires_grad_(True)
    ((-Vi(xs).sqdist(Vj(y)) / 0.03).exp() @ b).sum().backward()
"""


def generated_sources(kind: str, D: int, N: int = 2000) -> list[str]:
    """The sources of the kernels that ``kind`` at dimension D builds (in a child process
    with an empty kernel cache and ``LAZYTENSOR_DEBUG=1``)."""
    repo = str(Path(__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory(prefix="lazytensor-floor-") as cache:
        env = dict(os.environ, LAZYTENSOR_DEBUG="1", LAZYTENSOR_CACHE_DIR=cache,
                   PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
        proc = subprocess.run([sys.executable, "-c", _CHILD.format(N=N, D=D, kind=kind)],
                              capture_output=True, text=True, env=env, timeout=600, check=True)
    parts = re.split(r"^\[lazytensor\] building [^\n]*\n", proc.stderr, flags=re.M)
    return [p for p in parts[1:] if "// formula:" in p]


# ------------------------------------------------------------------ C statements


_TOKEN = re.compile(r"\d+\.\d*(?:e[-+]?\d+)?f?|\d+|[A-Za-z_]\w*|<<=?|[-+*/?:<>=(),]")


def statement_ops(stmt: str) -> dict:
    """{"fma": n, "add": n} of one C assignment or return (constant quotients folded)."""
    stmt = re.sub(r"//[^\n]*", "", stmt).strip()
    if not stmt or "memcpy" in stmt or "<<" in stmt:
        return {"fma": 0, "add": 0}
    m = re.match(r"(?:return\b|[^=<>!]*[^=<>!+\-*/]=(?!=))(.*)", stmt, flags=re.S)
    rhs = m.group(1) if m else ""
    toks = _TOKEN.findall(rhs)
    num = re.compile(r"\d")
    mults = adds = selects = 0
    for k, t in enumerate(toks):
        prev = toks[k - 1] if k else None
        nxt = toks[k + 1] if k + 1 < len(toks) else None
        operand = prev is not None and (prev == ")" or re.match(r"\w", prev))
        if t in "*/" and not (prev and num.match(prev) and nxt and num.match(nxt)):
            mults += 1
        elif t in "+-" and operand:
            adds += 1
        elif t == "?":
            selects += 1
    fused = min(mults, adds)
    return {"fma": mults, "add": adds - fused + selects}


def exp_ops(source: str) -> dict:
    """The operations of the float ``lt_exp`` of a kernel's source."""
    m = re.search(r"LT_INLINE float lt_exp\(float x\) \{(.*?)\n\}", source, flags=re.S)
    if m is None:
        raise ValueError("no float lt_exp in the kernel source")
    total = {"fma": 0, "add": 0}
    for stmt in m.group(1).split(";"):
        for key, n in statement_ops(stmt).items():
            total[key] += n
    return total


# ------------------------------------------------------------------ the formula


def parse_formula(text: str):
    """``op(args...)`` as nested (op, [children], [ints]) tuples."""
    pos = 0

    def node():
        nonlocal pos
        m = re.compile(r"\s*([A-Za-z_]\w*)\(").match(text, pos)
        if m is None:
            raise ValueError(f"formula: expected an operation at {text[pos:pos + 40]!r}")
        pos = m.end()
        kids, ints = [], []
        while True:
            m_int = re.compile(r"\s*(-?\d+)\s*").match(text, pos)
            if m_int:
                ints.append(int(m_int.group(1)))
                pos = m_int.end()
            else:
                kids.append(node())
            sep = re.compile(r"\s*([,)])").match(text, pos)
            pos = sep.end()
            if sep.group(1) == ")":
                return (m.group(1), kids, ints)

    return node()


def _dim(n) -> int:
    op, kids, ints = n
    if op in ("Vi", "Vj", "Pm"):
        return ints[1]
    if op == "sum":
        return 1
    if op == "slice":
        return ints[1]
    if op == "concat":
        return sum(_dim(k) for k in kids)
    return max((_dim(k) for k in kids), default=1)


def formula_ops(text: str, exp: dict) -> dict:
    """Operations per pair of the formula ``text`` (subexpressions counted once)."""
    seen: set = set()
    total = {"fma": 0, "add": 0}

    def visit(n):
        key = repr(n)
        if key in seen:
            return
        seen.add(key)
        op, kids, _ = n
        d = _dim(n)
        if op == "sum" and kids[0][0] == "mul":
            seen.add(repr(kids[0]))
            for k in kids[0][1]:
                visit(k)
            total["fma"] += _dim(kids[0])
            return
        for k in kids:
            visit(k)
        if op == "sum":
            total["add"] += _dim(kids[0]) - 1
        elif op in ("mul", "div"):
            total["fma"] += d
        elif op == "exp":
            total["fma"] += d * exp["fma"]
            total["add"] += d * exp["add"]
        elif op not in ("Vi", "Vj", "Pm", "slice", "concat"):
            total["add"] += d  # sub, add, neg and anything else: one operation a component

    root = parse_formula(text)
    visit(root)
    return total, _dim(root)


def kernel_ops(source: str) -> dict:
    """Operations per pair and lane of one generated kernel: formula, reduction, dots."""
    exp = exp_ops(source)
    text = re.search(r"// formula: ([^\n]*)", source).group(1)
    ops, width = formula_ops(text, exp)
    acc = source[source.index("struct Acc {"):]
    if re.match(r"struct Acc \{\s*T v\[", acc):  # argKmin: sorted values and indices
        ops["add"] += 1
    elif re.match(r"struct Acc \{\s*TA m;", acc):  # log-sum-exp: max, subtract, exp, add
        ops["fma"] += exp["fma"]
        ops["add"] += exp["add"] + 3
    else:
        ops["add"] += width
    dots = re.search(r"lt_dot(\d+)\(", source)
    if dots:
        ops["fma"] += int(dots.group(1)) + 1
        ops["add"] += 2
    return ops


def workload_ops(kind: str, D: int) -> dict:
    """Operations per pair of every kernel the workload runs, added up."""
    total = {"fma": 0, "add": 0}
    for src in generated_sources(kind, D):
        for key, n in kernel_ops(src).items():
            total[key] += n
    return total


def floor_pairs_per_s(ops: dict, rates: dict) -> float:
    """Pairs per second at the limit: ops {"fma", "add"} per pair and lane; rates
    {"fma", "add", "mixed"} in lane operations per second."""
    t = max(ops["fma"] / rates["fma"], ops["add"] / rates["add"],
            (ops["fma"] + ops["add"]) / rates["mixed"])
    return 1 / t if t > 0 else float("inf")
