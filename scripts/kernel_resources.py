"""Exploration, no GPU needed: compile the KDA Triton kernels for sm_90 (H100/H200) on a CPU and print
what each needs per thread: registers, and the stack ptxas spilled to when 255 were not enough.

    python3 scripts/kernel_resources.py [kernel ...] [--num_warps=N] [--num_stages=N]

Triton compiles ahead of time for a named target (``GPUTarget("cuda", 90, 32)``) with the ptxas it
ships, and ``cuobjdump -res-usage`` (shipped too) reads the cubin. A kernel that spills (``STACK`` in
the hundreds of bytes) moves its tiles through local memory on every use: a lead for the kernel's
tiling or its warp count, to be timed on the GPU (``scripts/explore_kda.py``). The shapes are the
linear-attention suite's (bfloat16 inputs, K = V = 128, C = 64); without ``--num_*`` each kernel gets
the launch options the package gives it. The local Triton may be newer than the GPU host's, so the
counts can differ there a little; the comparison between two versions of a kernel is the point.
Nothing here is a recording.
"""

import json
import os
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from attn_gym_lite.ops.kda import chunked_triton as kda

BF16, F32, I32 = "*bf16", "*fp32", "*i32"
K = V = 128
C = 64
SUB = getattr(kda, "_SUB", 16)
LAYOUT = {"cu_seqlens": I32, "chunk_offsets": I32, "num_seqs": "i32", "num_rows": "i32", "H": "i32", "scale": "fp32"}
# Pointer dtypes for bfloat16 inputs: what only feeds matrix products is stored in bfloat16, the decay
# cumsum, Γ, the inverse and the backward's coefficients in float32 (see chunked_triton._kda_forward).
POINTERS = {
    "q": BF16, "k": BF16, "v": BF16, "beta": BF16, "g": BF16, "qk": BF16, "w": BF16, "u": BF16, "q_decayed": BF16,
    "k_to_end": BF16, "states": BF16, "d_o": BF16, "d_u": BF16, "d_states": BF16, "dv": BF16, "dbeta": BF16,
    "dq": BF16, "dk": BF16, "g_cum": F32, "gram": F32, "inverse": F32, "d_qk": F32, "d_gram": F32,
    "d_qk_out": F32, "d_gram_out": F32, "dq_part": F32, "dk_part": F32, "dG_part": F32, "dg": F32,
}
CONSTANTS = {"K": K, "V": V, "C": C, "BC": SUB, "LOG2_BC": SUB.bit_length() - 1, "BV": 32, "PRECISION": "tf32",
             "BK": getattr(kda, "_key_block", lambda width: width)(K)}  # what the package launches
KERNELS = {  # name -> the launch options the package uses (Triton's defaults where it passes none)
    "kda_intra_kernel": kda._INTRA,
    "kda_solve_kernel": kda._SOLVE,
    "kda_wy_kernel": kda._WY,
    "kda_chunk_backward_kernel": kda._CHUNK_BACKWARD,
    "kda_pairwise_backward_kernel": kda._PAIRWISE,
}


def resources(name: str, options: dict) -> dict:
    fn = getattr(kda, name)
    constants = {a: CONSTANTS[a] for a in fn.arg_names if a in CONSTANTS}
    signature = {a: "constexpr" if a in constants else POINTERS.get(a, LAYOUT.get(a)) for a in fn.arg_names}
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(a),): value for a, value in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", cubin.name],
                               capture_output=True, text=True, check=True).stdout
    fields = dict(item.split(":", 1) for line in usage.splitlines() if line.strip().startswith("REG:")
                  for item in line.split())
    return {"kernel": name, "num_warps": compiled.metadata.num_warps, "num_stages": compiled.metadata.num_stages,
            "registers": int(fields["REG"]), "stack_bytes": int(fields["STACK"]),
            "shared_bytes": compiled.metadata.shared}


def main() -> None:
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or list(KERNELS)
    override = {key[2:]: int(value) for key, value in (a.split("=") for a in sys.argv[1:] if a.startswith("--"))}
    for name in names:
        try:
            print(json.dumps(resources(name, {**KERNELS[name], **override})))
        except Exception as error:  # one kernel's failure must not hide the others
            print(json.dumps({"kernel": name, "error": f"{type(error).__name__}: {str(error)[:400]}"}))


if __name__ == "__main__":
    main()
