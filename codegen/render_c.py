"""C emission shared by every backend, and the base renderer the backends subclass.

The pieces here are C text that g++ and nvcc both compile:

- :func:`prelude`: headers, ``LT_HD`` / ``LT_INLINE`` (``__host__ __device__`` and
  ``__forceinline__`` under nvcc), the types ``T`` (data) and ``TA`` (accumulator), then a
  backend's own definitions;
- :func:`array` and :func:`loop`: declarations and loop headers, as the kernel skeletons
  write them;
- :func:`render_function` / :func:`render_formula`: IR as an inline function, such as the
  per-pair formula ``lt_formula(v0, v1, ..., out)``: one local array per IR node, each line
  commented with the node it comes from;
- :func:`formula_call` and :func:`acc_call`: the calls of the formula and of the
  accumulator's hooks (``init``, ``push``, ``tile``, ``flush``, ``merge``, ``write``) that
  both skeletons make.

:class:`CRenderer` holds what a backend changes, as tables and hooks (the CPU's
:class:`~lazytensor.codegen.cpu.kernel.CpuRenderer`, the CUDA's
:class:`~lazytensor.codegen.cuda.render.CudaRenderer`): its own maths functions, where
large node values live, the definitions it adds to the prelude, and the accumulator (its
dtype and the C text of its ``struct Acc``).

>>> from lazytensor.codegen import ir, ops
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> src = CRenderer("float32").shared(ops.apply("sum", ops.apply("mul", x, y)),
...                                   [VarSpec(0, 3, "i"), VarSpec(1, 3, "j")], "sum", {})
>>> "lt_formula" in src and "struct Acc" in src
True
>>> loop("jj", "nj"), array("fb", "3 * TJ", align=64)
('for (int jj = 0; jj < nj; ++jj)', 'alignas(64) T fb[3 * TJ];')
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


def array(name: str, dim, ctype: str = "T", align: int = 0) -> str:
    """The declaration of a local array of ``dim`` values (``align``: its alignment)."""
    return f"{f'alignas({align}) ' if align else ''}{ctype} {name}[{dim}];"


def loop(var: str, stop, start="0", ctype: str = "int") -> str:
    """The header of a loop of ``var`` over [start, stop)."""
    return f"for ({ctype} {var} = {start}; {var} < {stop}; ++{var})"


def formula_call(args: list, out: str = "o", name: str = "lt_formula") -> str:
    """One evaluation of the function ``name`` (the per-pair formula) into ``out``."""
    return f"{name}({', '.join([*args, out])});"


# The accumulator's hooks every skeleton calls, as the reductions' ``struct Acc`` names them
# (codegen.reductions.base lists what each does).
ACC_HOOKS = ("init", "push", "tile", "flush", "merge", "write")


def acc_call(acc: str, hook: str, *args: str) -> str:
    """The statement that calls ``hook`` (one of :data:`ACC_HOOKS`) of accumulator ``acc``.

    >>> acc_call("accs[i - i0]", "tile", "fb", "nj", "j0")
    'accs[i - i0].tile(fb, nj, j0);'
    """
    if hook not in ACC_HOOKS:
        raise ValueError(f"unknown accumulator hook {hook!r}; expected one of {ACC_HOOKS}")
    return f"{acc}.{hook}({', '.join(args)});"


def render_function(name: str, roots: list, var_specs: list, dtype: str,
                    functions: tuple = (), qualifiers: str = "LT_HD LT_INLINE",
                    storage: footprint.Storage | None = None) -> str:
    """``name(v..., out)``: the values of ``roots`` one after the other in ``out``.

    One local array per IR node, each commented with the node it comes from; ``functions``
    (pairs: libm's name, the backend's) names the backend's own maths functions. With a
    ``storage.heap`` (the C expression of a buffer of at least
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

    def alignment(node) -> int:
        return storage.align if storage.align and node.dim * size >= 32 else 0
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
            kind = "static const T" if node in place.static else "const T"
            body.append(f"  {array(tname, node.dim, kind, alignment(node))[:-1]} = {{{vals}}};"
                        f"  // {comment}")
            continue
        code = ops.emit_c(node, tname, [names[id(a)] for a in node.args], dtype, functions)
        if node in place.heap:
            body.append(f"  T* const __restrict__ {tname} = {storage.heap} + {place.heap[node]};"
                        f"  // {comment}")
        else:
            body.append(f"  {array(tname, node.dim, align=alignment(node))}  // {comment}")
        body.append(f"  {code}")
    offset = 0
    for root in roots:
        body.append(f"  {loop('k', root.dim)} out[{offset} + k] = {names[id(root)]}[k];")
        offset += root.dim
    params = "".join(f"const T* __restrict__ v{v.index}, " for v in var_specs)
    return (
        f"{qualifiers} void {name}({params}T* __restrict__ out) {{\n"
        + "\n".join(body)
        + "\n}\n"
    )


def render_formula(formula: ir.Node, var_specs: list[VarSpec], dtype: str, functions: tuple = (),
                   storage: footprint.Storage | None = None) -> str:
    """``lt_formula``: one pair's formula value, from pointers to each variable's data
    (``functions``, ``storage``: see :func:`render_function`)."""
    return (f"// formula: {ir.to_text(formula)[:2000]}\n"
            + render_function("lt_formula", [formula], var_specs, dtype, functions,
                              storage=storage))


class CRenderer:
    """The C text of the parts every backend's kernel shares, and the tables and hooks a
    backend's renderer overrides (the shape of tinygrad's ``CStyleLanguage``):

    - ``functions`` (table): the backend's own maths functions, libm's name -> its own
      (the C text of every op calls them, :class:`~lazytensor.codegen.ops.CDialect`);
    - ``storage`` (table): where node values too large for the stack go (None: all stay);
    - :meth:`prelude_defs` (hook): what the backend adds to the prelude after ``T``, ``TA``;
    - :meth:`acc_dtype` and :meth:`accumulator` (hooks): the accumulator's dtype and the C
      text of its ``struct Acc``, whose hooks (:data:`ACC_HOOKS`) the skeleton calls,
      assembled from the reduction record's description of the form ``acc_form``.

    A renderer is made per kernel dtype; the backends add their skeleton (``kernel``).
    """

    name = "c"
    acc_form = reductions.base.TILES  # tiles of terms in a buffer (codegen.reductions.base)
    functions: dict = {}
    storage: footprint.Storage | None = None

    def __init__(self, dtype: str):
        self.dtype = dtype
        self.function_table = tuple(sorted(self.functions.items()))

    # ------------------------------------------------------------------ hooks
    def prelude_defs(self) -> str:
        """The backend's definitions after ``T`` and ``TA`` (a plain ``lt_exp`` here)."""
        return _GENERIC_EXP

    def acc_dtype(self, reduction: str, opts: dict) -> str:
        """The accumulator's dtype (``TA``)."""
        return reductions.get(reduction).acc_dtype(self.dtype, opts)

    def accumulator(self, formula: ir.Node, reduction: str, opts: dict) -> str:
        """The C text of the reduction's ``struct Acc`` for ``formula``'s values: the
        record's accumulator description of this renderer's ``acc_form``, assembled."""
        red = reductions.get(reduction)
        return red.accumulator(formula.dim, opts, self.acc_form).struct(self.acc_form)

    # ------------------------------------------------------------------ pieces
    def prelude(self, acc_dtype: str) -> str:
        return prelude(self.dtype, acc_dtype, self.prelude_defs())

    def function(self, name: str, roots: list, var_specs: list,
                 qualifiers: str = "LT_HD LT_INLINE") -> str:
        """:func:`render_function` with this backend's functions and storage."""
        return render_function(name, roots, var_specs, self.dtype, self.function_table,
                               qualifiers, self.storage)

    def formula(self, formula: ir.Node, var_specs: list) -> str:
        """``lt_formula`` (:func:`render_formula`) with this backend's functions and storage."""
        return render_formula(formula, var_specs, self.dtype, self.function_table, self.storage)

    def shared(self, formula: ir.Node, var_specs: list, reduction: str, opts: dict,
               tj: int = 1) -> str:
        """Prelude, formula and ``Acc``: ``tj`` is the length of the tiles of terms
        ``Acc::tile`` reads (the CPU's; 1 where no tiles are handed over)."""
        return (self.prelude(self.acc_dtype(reduction, opts))
                + f"static const int TJ = {tj};\n"
                + self.formula(formula, var_specs)
                + self.accumulator(formula, reduction, opts)
                + "\n")
