"""Without Triton (a CPU build of torch does not bring it), everything but the kernels works and
asking for a kernel says what to install. Each case runs in an interpreter where ``import triton`` fails."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELUDE = """
import sys
sys.modules['triton'] = None  # import triton -> ImportError, as when not installed

def import_error(fn):
    try:
        fn()
    except ImportError as caught:
        return str(caught)
"""


def run_without_triton(code: str) -> dict:
    """Run ``code`` in a new interpreter in which ``import triton`` raises ImportError; it prints
    one JSON object as its last line, returned here."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def says_what_to_install(message, instead):
    return message is not None and "pip install" in message and instead in message


def test_auto_attention_is_the_reference_and_triton_says_what_to_install():
    result = run_without_triton("""
        import json, math, torch
        from attn_gym_lite.ops.attention import resolve_impl, varlen_attention

        torch.manual_seed(0)
        q, k, v = (torch.randn(7, 2, 16, dtype=torch.float32) for _ in range(3))
        cu = torch.tensor([0, 3, 5, 5], dtype=torch.int32)
        out = varlen_attention(q, k, v, cu, causal=True)
        # Independent reference: causal softmax attention written out per sequence, per query.
        expected = torch.zeros_like(q)
        for start, end in ((0, 3), (3, 5)):
            for t in range(start, end):
                scores = torch.einsum("hd,shd->hs", q[t], k[start:t + 1]) / math.sqrt(16)
                expected[t] = torch.einsum("hs,shd->hd", scores.softmax(-1), v[start:t + 1])
        print(json.dumps({"auto": resolve_impl("auto", q), "error": (out - expected).abs().max().item(),
                          "triton": import_error(lambda: varlen_attention(q, k, v, cu, impl="triton"))}))
    """)
    assert result["auto"] == "reference" and result["error"] < 1e-5
    assert says_what_to_install(result["triton"], "impl='auto'")


def test_the_readme_training_loop_trains_on_a_cpu():
    result = run_without_triton("""
        import json, torch
        from attn_gym_lite.data import BestFit, PackedLoader, load_tokenizer
        from attn_gym_lite.graph import FixedCapacityTrainer
        from attn_gym_lite.models import PackedTransformer

        texts = [f"def f{i}(x):\\n    return x * {i}\\n" * (1 + i % 4) for i in range(40)]
        tokenizer = load_tokenizer(vocab_size=300, max_training_bytes=20_000)
        loader = PackedLoader(64, corpus=texts, tokenizer=tokenizer, policy=BestFit(8), prefetch=0)
        torch.manual_seed(0)
        model = PackedTransformer(tokenizer.vocab_size, 32, 2, 1, device="cpu", dtype=torch.float32)
        batches = iter(loader)
        trainer = FixedCapacityTrainer(model, next(batches), use_graph=False)
        losses = [trainer.step(batch).item() for batch, _ in zip(batches, range(3))]
        print(json.dumps({"losses": losses}))
    """)
    assert len(result["losses"]) == 3 and all(0 < loss < 20 for loss in result["losses"])


def test_kda_and_short_conv_run_their_references_and_their_kernels_say_what_to_install():
    result = run_without_triton("""
        import json, torch
        from attn_gym_lite.models.kda import KDAAttention
        from attn_gym_lite.ops.short_conv import resolve_short_conv_impl, short_conv

        layer = KDAAttention(32, 2, 16, impl="chunked", chunk_size=16)
        out = layer(torch.randn(10, 32), torch.tensor([0, 4, 10], dtype=torch.int32))
        x, w, cu = torch.arange(12.0).reshape(4, 3), torch.ones(3, 2), torch.tensor([0, 2, 4], dtype=torch.int32)

        def kda_kernel():
            from attn_gym_lite.ops.kda import kda_triton  # noqa: F401

        print(json.dumps({"shape": list(out.shape), "kda": import_error(kda_kernel),
                          "auto": resolve_short_conv_impl("auto", x), "y": short_conv(x, w, cu).tolist(),
                          "conv": import_error(lambda: short_conv(x, w, cu, impl="triton"))}))
    """)
    assert result["shape"] == [10, 32] and says_what_to_install(result["kda"], "kda_chunked")
    assert result["auto"] == "torch" and says_what_to_install(result["conv"], "impl='auto'")
    # Width 2, all-ones weight: each row plus the previous row of its own sequence (rows 0 and 2 start one).
    assert result["y"] == [[0, 1, 2], [3, 5, 7], [6, 7, 8], [15, 17, 19]]
