"""C emission shared by every backend: the per-pair formula and the reduction's hooks.

The formula becomes ``lt_formula(v0, v1, ..., out)``: one local array per IR node, each
line commented with the node it comes from. It and the reduction's ``Acc`` struct are
emitted by :func:`render_shared` as inline functions that g++ and nvcc both compile
(``LT_HD`` is ``__host__ __device__`` under nvcc). A backend adds its own definitions to
the prelude (the CPU's vectorizable ``lt_exp``, :mod:`lazytensor.codegen.cpu.simd`) and its
kernel skeleton around this (:mod:`lazytensor.codegen.cpu.kernel`,
:mod:`lazytensor.codegen.render_cuda`).

>>> from lazytensor.codegen import ir, ops
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> src = render_shared(ops.apply("sum", ops.apply("mul", x, y)),
...                     [VarSpec(0, 3, "i"), VarSpec(1, 3, "j")], "sum", {}, "float32")
>>> "lt_formula" in src and "struct Acc" in src
True
"""

from __future__ import annotations

from dataclasses import dataclass

from . import footprint, ir, ops, reductions


@dataclass(frozen=True)
class VarSpec:
    """A bound variable slot of a kernel: its index, vector dimension and category."""

    index: int
    dim: int
    cat: str


# ``lt_exp`` where the backend brings none of its own: the reductions' CPU ``tile`` hook
# calls it, and that hook is compiled (never run) by the other backends too.
_GENERIC_EXP = """LT_HD LT_INLINE float lt_exp(float x) { return expf(x); }
LT_HD LT_INLINE double lt_exp(double x) { return exp(x); }
"""


# A value rounded to its type: where the compiler may not contract a product into the
# addition that follows (FMA), so that the value is the same as where it was stored
# (nvcc, whose fast math folds x + 0, never merges __fadd_rn into a multiply-add).
_ROUNDED = """#ifdef __CUDA_ARCH__
__device__ LT_INLINE float lt_rounded(float x) { return __fadd_rn(x, 0.0f); }
__device__ LT_INLINE double lt_rounded(double x) { return __dadd_rn(x, 0.0); }
#else
LT_INLINE float lt_rounded(float x) { return x + 0.0f; }
LT_INLINE double lt_rounded(double x) { return x + 0.0; }
#endif
"""


def prelude(dtype: str, acc_dtype: str, backend_defs: str | None = None) -> str:
    """Headers, ``LT_HD`` / ``LT_INLINE``, the types ``T`` (data) and ``TA`` (accumulator),
    then ``backend_defs`` (default: a plain ``lt_exp``)."""
    t = "float" if dtype == "float32" else "double"
    ta = "float" if acc_dtype == "float32" else "double"
    return f"""#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __CUDACC__
#define LT_HD __host__ __device__
#define LT_INLINE __forceinline__
#else
#define LT_HD
#define LT_INLINE inline __attribute__((always_inline))
#endif
typedef {t} T;
typedef {ta} TA;
{_ROUNDED}{_GENERIC_EXP if backend_defs is None else backend_defs}"""


def render_function(name: str, roots: list, var_specs: list, dtype: str,
                    rename=None, qualifiers: str = "LT_HD LT_INLINE",
                    storage: footprint.Storage | None = None) -> str:
    """``name(v..., out)``: the values of ``roots`` one after the other in ``out``.

    One local array per IR node, each commented with the node it comes from; ``rename``
    (a function of the code text) adapts it to a backend. With a ``storage.heap`` (the C
    expression of a buffer of at least
    :func:`~lazytensor.codegen.footprint.function_footprint`'s ``heap_elements``
    values), the largest values beyond the stack budget
    (:data:`~lazytensor.codegen.footprint.FUNCTION_STACK_BYTES`) live there instead, and
    large constants in static storage; ``storage.align`` aligns the larger arrays.
    """
    names: dict[int, str] = {}
    body: list[str] = []
    storage = storage or footprint.Storage()
    place = (footprint.function_footprint(roots, var_specs, dtype, footprint.FUNCTION_STACK_BYTES)
             if storage.heap is not None else footprint.Footprint(0))
    size = footprint.element_size(dtype)

    def aligned(node) -> str:
        return f"alignas({storage.align}) " if storage.align and node.dim * size >= 32 else ""
    for v in var_specs:
        names[id(ir.var(v.index, v.dim, v.cat))] = f"v{v.index}"
    for n, node in enumerate(ir.topo_order(roots)):
        if id(node) in names:
            continue
        if node.op == "var":
            raise ValueError(f"formula variable {ir.to_text(node)} is not bound")
        tname = f"t{n}"
        names[id(node)] = tname
        comment = ir.to_text(node)
        comment = comment if len(comment) < 100 else comment[:97] + "..."
        if node.op == "const":
            vals = ", ".join(ops.c_literal(v, dtype) for v in node.params)
            kind = "static const" if node in place.static else "const"
            body.append(f"  {aligned(node)}{kind} T {tname}[{node.dim}] = {{{vals}}};  // {comment}")
            continue
        opdef = ops.get(node.op)
        code = opdef.emit(node, tname, [names[id(a)] for a in node.args], dtype)
        if node in place.heap:
            body.append(f"  T* const __restrict__ {tname} = {storage.heap} + {place.heap[node]};"
                        f"  // {comment}")
        else:
            body.append(f"  {aligned(node)}T {tname}[{node.dim}];  // {comment}")
        body.append(f"  {rename(code) if rename else code}")
    offset = 0
    for root in roots:
        body.append(f"  for (int k = 0; k < {root.dim}; ++k) out[{offset} + k] = {names[id(root)]}[k];")
        offset += root.dim
    params = "".join(f"const T* __restrict__ v{v.index}, " for v in var_specs)
    return (
        f"{qualifiers} void {name}({params}T* __restrict__ out) {{\n"
        + "\n".join(body)
        + "\n}\n"
    )


def render_formula(formula: ir.Node, var_specs: list[VarSpec], dtype: str, rename=None,
                   storage: footprint.Storage | None = None) -> str:
    """``lt_formula``: one pair's formula value, from pointers to each variable's data
    (``storage``: see :func:`render_function`)."""
    return (f"// formula: {ir.to_text(formula)[:2000]}\n"
            + render_function("lt_formula", [formula], var_specs, dtype, rename,
                              storage=storage))


def render_shared(formula, var_specs, reduction: str, opts: dict, dtype: str, *,
                  tj: int = 1, rename=None, backend_defs: str | None = None,
                  storage: footprint.Storage | None = None) -> str:
    """The part of the source that every backend compiles: prelude, formula, Acc.

    ``tj`` is the length of the tiles of terms ``Acc::tile`` reads (the CPU's; 1 where no
    tiles are handed over), ``rename``, ``backend_defs`` and ``storage`` (see
    :func:`render_function`) the backend's adaptations.
    """
    red = reductions.get(reduction)
    return (
        prelude(dtype, red.acc_dtype(dtype, opts), backend_defs)
        + f"static const int TJ = {tj};\n"
        + render_formula(formula, var_specs, dtype, rename, storage)
        + red.acc_code(formula.dim, opts)
        + "\n"
    )
