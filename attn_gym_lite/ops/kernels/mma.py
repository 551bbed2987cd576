"""``dot``: the matrix product every kernel of the package uses, correct in Triton's interpreter too.

On a GPU it is ``tl.dot`` unchanged. Under ``TRITON_INTERPRET=1`` Triton 3.9's interpreter
multiplies bfloat16 tiles as the 16-bit integers it stores them in (its ``create_dot`` has no
bfloat16 case): a bfloat16 attention on the CPU returned about ``8e8`` where the answer was
``0.3``, with no error. So there the operands are widened to float32 first. That is exact (the
product of two bfloat16 or float16 values fits in float32's mantissa), so the interpreter still
sees every rounding of the inputs the GPU sees; only the order of the float32 sums differs.
"""

import triton
import triton.language as tl


@triton.jit
def _probe():
    pass


# Set when TRITON_INTERPRET=1 was in the environment before this module was imported (Triton
# replaces every @triton.jit function by an interpreted one then).
INTERPRETED = type(_probe).__name__ == "InterpretedFunction"
_WIDEN_OPERANDS = tl.constexpr(INTERPRETED)


@triton.jit
def dot(a, b, acc, PRECISION: tl.constexpr):
    """``acc + a @ b`` with a float32 result (``acc`` may be ``None``): ``tl.dot(a, b, acc,
    input_precision=PRECISION)`` on a GPU (``PRECISION`` ``None`` is ``tl.dot``'s default), and in
    the interpreter the same product with both operands widened to float32 first."""
    if _WIDEN_OPERANDS:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=PRECISION)
