"""What a compiled kernel costs, read from nvcc's output without a GPU.

- :func:`resources`: registers, stack frame and spills per entry, from ``ptxas -v``;
- :func:`f64_by_depth`: the double-precision instructions of an entry's PTX, with the
  loop depth of each (back edges ``bra`` to an earlier label delimit loops), so that a
  float32 kernel can be checked to keep doubles out of its per-pair loops;
- :func:`audit`: both for one source, compiled for one architecture.

>>> resources("ptxas info    : Compiling entry function 'k' for 'sm_90'\\n"
...           "ptxas info    : Function properties for k\\n"
...           "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\\n"
...           "ptxas info    : Used 40 registers, used 1 barriers\\n")["k"]["registers"]
40
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")
_F64 = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z]+(?:\.[a-z0-9]+)*\.f64\b[^;]*);")


def resources(log: str) -> dict:
    """``{entry: {"registers", "stack", "spill_stores", "spill_loads"}}`` from ptxas -v."""
    out, name = {}, None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            name = m.group(1)
            out[name] = {"registers": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0}
            continue
        if name is None:
            continue
        m = _FRAME.search(line)
        if m:
            out[name].update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                             spill_loads=int(m.group(3)))
        m = _REGS.search(line)
        if m:
            out[name]["registers"] = int(m.group(1))
    return out


def entry_body(ptx: str, name: str) -> list[str]:
    """The lines of entry ``name``'s body in a PTX module."""
    start = ptx.find(f".entry {name}(")
    if start < 0:
        raise ValueError(f"no entry {name} in the PTX")
    lines = ptx[start:].splitlines()
    depth, body = 0, []
    for line in lines:
        depth += line.count("{") - line.count("}")
        body.append(line)
        if depth == 0 and "}" in line:
            break
    return body


def loop_depths(body: list[str]) -> list[int]:
    """Per line, how many loops contain it: a ``bra`` to a label defined earlier closes the
    loop that starts at that label."""
    labels = {}
    for n, line in enumerate(body):
        m = re.match(r"^\s*(\$\w+):", line)
        if m:
            labels[m.group(1)] = n
    depth = [0] * len(body)
    for n, line in enumerate(body):
        m = re.search(r"\bbra(?:\.uni)?\s+(\$\w+);", line)
        if m and labels.get(m.group(1), n + 1) <= n:
            for k in range(labels[m.group(1)], n + 1):
                depth[k] += 1
    return depth


def f64_by_depth(ptx: str, name: str) -> list[tuple[int, str]]:
    """(loop depth, instruction) for each f64 instruction of entry ``name``."""
    body = entry_body(ptx, name)
    depth = loop_depths(body)
    out = []
    for line, d in zip(body, depth):
        m = _F64.match(line)
        if m and not m.group(1).startswith(("ld.param", "mov.f64")):
            out.append((d, m.group(1).strip()))
    return out


def audit(source: str, arch: str = "sm_90", fast_math: bool = False) -> dict:
    """``{"resources": ..., "ptx": text}`` of a CUDA source (nvcc to PTX, then ptxas -v)."""
    from .nvcc import compile_cuda, nvcc_path

    with tempfile.TemporaryDirectory(prefix="lazytensor-ptxas-") as tmp:
        tmp = Path(tmp)
        ptx_path = compile_cuda(source, tmp, arch, "audit", output="ptx", fast_math=fast_math)
        ptxas = Path(nvcc_path()).resolve().parent / "ptxas"
        cmd = [str(ptxas if ptxas.exists() else "ptxas"), f"-arch={arch}", "-v", str(ptx_path),
               "-o", str(tmp / "audit.cubin")]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise RuntimeError(f"ptxas failed: {' '.join(cmd)}\n{proc.stderr[-4000:]}")
        return {"resources": resources(proc.stderr + proc.stdout),
                "ptx": ptx_path.read_text()}


__all__ = ["audit", "entry_body", "f64_by_depth", "loop_depths", "resources"]
