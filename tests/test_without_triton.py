"""Without Triton installed (a CPU build of torch does not bring it, and the package's dependencies
leave it out), everything but the Triton kernels works: ``impl="auto"`` picks the reference
attention, the README's training loop trains, the KDA references import, and asking for a kernel
says what to install. Each case runs in a fresh interpreter where ``import triton`` fails."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_without_triton(code: str) -> dict:
    """Run ``code`` in a new interpreter in which ``import triton`` raises ImportError; it prints
    one JSON object as its last line, returned here."""
    prelude = "import sys\nsys.modules['triton'] = None  # import triton -> ImportError, as when not installed\n"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


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
        try:
            varlen_attention(q, k, v, cu, impl="triton")
            error = None
        except ImportError as caught:
            error = str(caught)
        print(json.dumps({"auto": resolve_impl("auto", q), "error": (out - expected).abs().max().item(),
                          "triton": error}))
    """)
    assert result["auto"] == "reference"
    assert result["error"] < 1e-5
    assert result["triton"] is not None and "pip install" in result["triton"] and "impl='auto'" in result["triton"]


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


def test_the_kda_references_import_and_the_kernel_says_what_to_install():
    result = run_without_triton("""
        import json, torch
        from attn_gym_lite.models.kda import KDAAttention
        from attn_gym_lite.ops.kda import kda_chunked, kda_recurrent

        layer = KDAAttention(32, 2, 16, impl="chunked", chunk_size=16)
        out = layer(torch.randn(10, 32), torch.tensor([0, 4, 10], dtype=torch.int32))
        try:
            from attn_gym_lite.ops.kda import kda_triton  # noqa: F401
            error = None
        except ImportError as caught:
            error = str(caught)
        print(json.dumps({"shape": list(out.shape), "triton": error}))
    """)
    assert result["shape"] == [10, 32]
    assert result["triton"] is not None and "pip install" in result["triton"] and "kda_chunked" in result["triton"]


def test_the_short_convolution_runs_its_tensor_ops_and_triton_says_what_to_install():
    result = run_without_triton("""
        import json, torch
        from attn_gym_lite.ops.short_conv import resolve_short_conv_impl, short_conv

        x = torch.arange(12.0).reshape(4, 3)
        w = torch.ones(3, 2)
        cu = torch.tensor([0, 2, 4], dtype=torch.int32)
        try:
            short_conv(x, w, cu, impl="triton")
            error = None
        except ImportError as caught:
            error = str(caught)
        print(json.dumps({"auto": resolve_short_conv_impl("auto", x), "y": short_conv(x, w, cu).tolist(),
                          "triton": error}))
    """)
    assert result["auto"] == "torch"
    # Width 2, all-ones weight: each row plus the previous row of its own sequence (rows 0 and 2 start one).
    assert result["y"] == [[0, 1, 2], [3, 5, 7], [6, 7, 8], [15, 17, 19]]
    assert result["triton"] is not None and "pip install" in result["triton"] and "impl='auto'" in result["triton"]
