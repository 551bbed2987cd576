"""VarLenAttention and PackedLM against independent computations; the models' input checks."""

import math
import re

import pytest
import torch
import torch.nn.functional as F
from helpers import calling

from attn_gym_lite.models import PackedLM, PackedTransformer, ShortConvAttentionBlock, VarLenAttention
from attn_gym_lite.ops.attention import varlen_attention_reference
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens


def test_varlen_attention_module_equals_per_document_computation():
    torch.manual_seed(0)
    module = VarLenAttention(16, 4, causal=True).double()
    lengths = [5, 1, 9]
    cu = cu_seqlens_from_lengths(lengths)
    x = torch.randn(15, 16, dtype=torch.float64)
    out = module(x, cu, 9)
    # Each document alone, through plain matmuls and SDPA: documents must not see each other.
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qkv = x[start:end] @ module.qkv.weight.T
        q, k, v = qkv.view(end - start, 3, 4, 4).permute(1, 2, 0, 3)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(1, 0, 2).reshape(end - start, 16)
        torch.testing.assert_close(out[start:end], attn @ module.out_proj.weight.T)


def nan_on_inactive_rows(q, k, v, cu_seqlens, max_seqlen, *, causal=False):
    """Like torch's varlen_attn at padded capacity, with its undefined rows shown as NaN: inactive
    output rows and their q/k/v gradients are NaN here (torch leaves them undefined)."""
    out = varlen_attention_reference(q, k, v, cu_seqlens, causal=causal)
    inactive = torch.arange(q.shape[0]) >= cu_seqlens[-1]
    poison = (q + k + v) * torch.where(inactive, float("nan"), 0.0)[:, None, None]
    return torch.where(inactive[:, None, None], out + poison, out)


@pytest.mark.parametrize("masked", [True, False])
def test_mask_inactive_capacity_stops_undefined_attention_rows(monkeypatch, masked):
    monkeypatch.setattr("attn_gym_lite.models.attention.varlen_attention", calling(nan_on_inactive_rows))
    torch.manual_seed(0)
    module = VarLenAttention(8, 2, mask_inactive_capacity=masked).double()
    x = torch.randn(8, 8, dtype=torch.float64)  # rows 5..7 are inactive capacity
    out = module(x, pad_cu_seqlens(cu_seqlens_from_lengths([3, 2]), 4), 3)
    grads = torch.autograd.grad(out.sum(), tuple(module.parameters()))
    # The exact computation: only the 5 real rows, no capacity at all.
    exact = VarLenAttention(8, 2).double()
    exact.load_state_dict(module.state_dict())
    exact_out = exact(x[:5], cu_seqlens_from_lengths([3, 2]), 3)
    exact_grads = torch.autograd.grad(exact_out.sum(), tuple(exact.parameters()))
    if masked:
        assert torch.equal(out[5:], torch.zeros_like(out[5:])), "inactive output rows must be zero"
        torch.testing.assert_close(out[:5], exact_out)
        for g, e in zip(grads, exact_grads):
            torch.testing.assert_close(g, e)
    else:  # the masks matter: without them the NaN reaches every weight gradient
        assert all(g.isnan().any() for g in grads)


def test_dim_must_divide_into_heads():
    with pytest.raises(ValueError, match="dim must be a positive multiple of num_heads, got dim=10, num_heads=4"):
        VarLenAttention(10, 4)


def test_packed_lm_loss_is_masked_mean_cross_entropy():
    torch.manual_seed(0)
    model = PackedLM(50, 16, 2).double()
    cu = pad_cu_seqlens(cu_seqlens_from_lengths([4, 3]), 3)
    ids = torch.randint(50, (10,))
    labels = torch.randint(50, (10,))
    mask = torch.tensor([1, 1, 1, 0, 1, 1, 0, 0, 0, 0], dtype=torch.bool)
    loss = model.loss(ids, labels, mask, cu, 4)
    logits = model(ids, cu, 4)
    expected = sum(F.cross_entropy(logits[t], labels[t]) for t in range(10) if mask[t]) / int(mask.sum())
    torch.testing.assert_close(loss.double(), expected)
    # An empty mask gives 0, not NaN.
    assert model.loss(ids, labels, torch.zeros(10, dtype=torch.bool), cu, 4).item() == 0.0


def test_packed_lm_attention_is_causal_within_documents():
    torch.manual_seed(0)
    model = PackedLM(50, 16, 2).double()
    cu = cu_seqlens_from_lengths([4, 4])
    ids = torch.randint(50, (8,))
    changed = ids.clone()
    changed[7] = (ids[7] + 1) % 50  # the last token of the second document
    a, b = model(ids, cu, 4), model(changed, cu, 4)
    torch.testing.assert_close(a[:7], b[:7])  # nothing before it may see it
    assert not torch.allclose(a[7], b[7])


@pytest.mark.gpu
def test_cuda_module_matches_cpu_reference():
    torch.manual_seed(0)
    module = VarLenAttention(256, 4, causal=True, mask_inactive_capacity=True)
    cu = pad_cu_seqlens(cu_seqlens_from_lengths([100, 1, 400]), 8)
    x = torch.randn(600, 256)
    expected = module(x, cu, 400)  # CPU: reference path, float32
    cuda = VarLenAttention(256, 4, causal=True, mask_inactive_capacity=True, device="cuda", dtype=torch.bfloat16)
    cuda.load_state_dict(module.state_dict())
    out = cuda(x.cuda().bfloat16(), cu.cuda(), 400)
    torch.testing.assert_close(out.float().cpu(), expected, atol=3e-2, rtol=3e-2)
    assert torch.equal(out[501:].float().cpu(), torch.zeros(99, 256))


# ---------------------------------------------------------------------------------------------
# The transformer of chapter 8: at capacity, with uninitialised memory read as NaN, its loss and
# every gradient equal those of the same model on the L real rows alone.


def _lm_batch(lengths, capacity, slots, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    active = sum(lengths)
    ids = torch.zeros(capacity, dtype=torch.int64)
    ids[:active] = torch.randint(0, vocab, (active,), generator=g)
    labels = torch.zeros_like(ids)
    mask = torch.zeros(capacity, dtype=torch.bool)
    start = 0
    for length in lengths:
        labels[start:start + length - 1] = ids[start + 1:start + length]
        mask[start:start + length - 1] = True
        start += length
    return ids, labels, mask, pad_cu_seqlens(cu_seqlens_from_lengths(lengths), slots)


@pytest.mark.parametrize("impl, dtype, tolerance", [("reference", torch.float64, 1e-10), ("auto", torch.float32, 1e-4)])
def test_transformer_at_capacity_equals_the_exact_computation(impl, dtype, tolerance):
    from attn_gym_lite.models import PackedTransformer
    from attn_gym_lite.ops.masking import uninitialized_memory_as_nan

    torch.manual_seed(0)
    model = PackedTransformer(50, 32, 2, 2, impl=impl).to(dtype)  # "auto": the Triton kernels here
    ids, labels, mask, cu = _lm_batch([7, 1, 9], capacity=24, slots=5, vocab=50, seed=0)
    params = tuple(model.parameters())
    with uninitialized_memory_as_nan():
        loss = model.loss(ids, labels, mask, cu)
        grads = torch.autograd.grad(loss, params)
    active = int(cu[-1])
    exact_loss = model.loss(ids[:active], labels[:active], mask[:active], cu)
    exact_grads = torch.autograd.grad(exact_loss, params)
    torch.testing.assert_close(loss, exact_loss, atol=tolerance, rtol=tolerance)
    for (name, _), g, e in zip(model.named_parameters(), grads, exact_grads):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, e, atol=tolerance, rtol=tolerance, msg=name)


def test_rotary_positions_restart_at_every_sequence():
    from attn_gym_lite.ops.rotary import apply_rotary, rotary_tables
    from attn_gym_lite.ragged import positions_in_sequence

    cu = pad_cu_seqlens(cu_seqlens_from_lengths([3, 0, 2]), 4)
    positions = positions_in_sequence(cu, 7)
    assert positions.tolist() == [0, 1, 2, 0, 1, 0, 1]  # rows 5, 6 are capacity: they count from L
    cos, sin = rotary_tables(positions, 4, base=100.0)
    # The published formula, element by element: angle = p * base^(-2j / D), pairs (j, j + D/2).
    x = torch.randn(7, 1, 4, dtype=torch.float64)
    out = apply_rotary(x, cos.double(), sin.double())
    for t, p in enumerate(positions.tolist()):
        for j in range(2):
            angle = p * 100.0 ** (-2 * j / 4)
            a, b = x[t, 0, j].item(), x[t, 0, j + 2].item()
            assert out[t, 0, j].item() == pytest.approx(a * math.cos(angle) - b * math.sin(angle), abs=1e-6)
            assert out[t, 0, j + 2].item() == pytest.approx(b * math.cos(angle) + a * math.sin(angle), abs=1e-6)


@pytest.mark.parametrize(("dim", "num_heads", "head_dim"), [(16, 2, 8), (100, 4, 25), (512, 2, 256)])
def test_triton_models_refuse_an_unsupported_head_dim_where_they_are_built(dim, num_heads, head_dim):
    """Before: PackedTransformer(100, 16, 2, 1, impl="triton") was built and failed only at its first
    forward, with "q.shape[2] (head dim D) must be one of (16, 32, 64, 128), got 8", naming neither
    dim nor num_heads."""
    from attn_gym_lite.models.block import ShortConvAttentionBlock
    from attn_gym_lite.models.lm import PackedLM, PackedTransformer

    message = (rf"impl='triton' needs a head dim dim // num_heads in \(16, 32, 64, 128\), got dim={dim}, "
               rf"num_heads={num_heads}: head dim {head_dim}$")
    for build in (lambda: PackedTransformer(100, dim, num_heads, 1, impl="triton"),
                  lambda: PackedLM(100, dim, num_heads, impl="triton"),
                  lambda: VarLenAttention(dim, num_heads, impl="triton")):
        with pytest.raises(ValueError, match=r"^VarLenAttention: " + message):
            build()
    with pytest.raises(ValueError, match=r"^ShortConvAttentionBlock: " + message):
        ShortConvAttentionBlock(dim, num_heads, impl="triton")
    # "auto" builds (it falls back to the reference path) and so does "reference"; a supported
    # head dim builds with "triton".
    # (PackedTransformer's attention is rotary: an odd head dim, 25, is refused there, see below.)
    if head_dim % 2 == 0:
        assert PackedTransformer(100, dim, num_heads, 1, impl="auto").blocks[0].attention.head_dim == head_dim
    assert PackedLM(100, dim, num_heads, impl="auto").attention.head_dim == head_dim
    assert VarLenAttention(dim, num_heads, impl="reference").head_dim == head_dim
    assert VarLenAttention(32, 2, impl="triton").head_dim == 16


# ---------------------------------------------------------------------------------------------
# Both language models check input_ids at the start of forward: its metadata always, the ids of a
# CPU tensor against the vocabulary (loss relies on forward for both: one place for the check).


def _both_models():
    from attn_gym_lite.models import PackedTransformer

    torch.manual_seed(0)
    return PackedLM(64, 32, 2), PackedTransformer(64, 32, 2, 1)


def test_forward_refuses_input_ids_that_are_not_integer_ids_of_shape_T():
    """Before: model(b.input_ids[None], b.cu_seqlens) failed in the attention with "cu_seqlens[-1]
    (active tokens L) must be <= token_capacity T = 1, got L = 8", naming neither input_ids nor its
    shape."""
    cu = pad_cu_seqlens(cu_seqlens_from_lengths([5, 3]), 3)
    ids = torch.randint(64, (16,))
    for model in _both_models():
        with pytest.raises(ValueError, match=r"^input_ids must have shape \[T\] \(1-D: a packed batch has no batch "
                                             r"dim\), got shape \(1, 16\)$"):
            model(ids[None], cu)
        with pytest.raises(ValueError, match=r"^input_ids must have shape \[T\] .*, got shape \(\)$"):
            model(ids[0], cu)
        with pytest.raises(TypeError, match=r"^input_ids must have dtype int64, int32, got torch.float32$"):
            model(ids.float(), cu)
        # int32 ids are token ids too (nn.Embedding takes both): the same logits as int64.
        torch.testing.assert_close(model(ids.int(), cu), model(ids, cu), rtol=0, atol=0)
        with pytest.raises(TypeError, match=r"^input_ids must be a torch.Tensor of shape \[T\] .*, got list$"):
            model(ids.tolist(), cu)
        # loss goes through forward: the same message.
        with pytest.raises(ValueError, match=r"^input_ids must have shape \[T\] .*, got shape \(1, 16\)$"):
            model.loss(ids[None], ids, torch.ones(16, dtype=torch.bool), cu)
        assert model(ids, cu).shape == (16, 64)


@pytest.mark.parametrize("stray", [64, 100, -1])
def test_forward_names_an_input_id_outside_the_vocabulary(monkeypatch, stray):
    """Before: PackedTransformer(64, 32, 2, 1)(ids_with_100, cu) failed with torch's bare
    "IndexError: index out of range in self"; only loss() checked the ids."""
    import attn_gym_lite.models.lm as lm

    cu = pad_cu_seqlens(cu_seqlens_from_lengths([5, 3]), 3)
    ids = torch.randint(64, (16,))
    bad = ids.clone()
    bad[[2, 9]] = stray  # row 9 is inactive capacity: an id there is refused too (it is embedded)
    message = (rf"^input_ids must be token ids in \[0, V\) = \[0, 64\) \(V = the embedding's vocabulary\), "
               rf"got input_ids\[2\] = {stray} \(2 such rows\)$")
    for model in _both_models():
        with pytest.raises(ValueError, match=message):
            model(bad, cu)
        ids[2] = 63  # the largest id is a token like any other
        assert torch.isfinite(model(ids, cu)).all()
    # One place for the check: loss checks the ids once, through forward.
    calls = []
    checked = lm._check_input_ids
    monkeypatch.setattr(lm, "_check_input_ids", lambda *a: calls.append(a) or checked(*a))
    active = torch.arange(16) < 8  # the loss counts the L = 8 active rows only
    for model in _both_models():
        with pytest.raises(ValueError, match=message):
            model.loss(bad, ids, active, cu)
        model.loss(ids, ids, active, cu)
    assert len(calls) == 4


def test_forward_reads_no_values_of_a_non_cpu_input_ids(monkeypatch):
    """Only a CPU tensor's ids are read (free there): a CUDA one is checked by metadata alone (a
    read would sync, and is impossible in a capture). A meta tensor stands for it here."""
    import attn_gym_lite.models.lm as lm

    monkeypatch.setattr(lm.torch, "nonzero", lambda *a, **k: pytest.fail("read the values of input_ids"))
    lm._check_input_ids(torch.full((16,), 100, device="meta"), 64)
    with pytest.raises(ValueError, match=r"^input_ids must have shape \[T\] .*, got shape \(1, 16\)$"):
        lm._check_input_ids(torch.full((1, 16), 100, device="meta"), 64)
    # While torch.compile traces, nothing is read either (the CPU check is eager only).
    monkeypatch.setattr(lm.torch.compiler, "is_compiling", lambda: True)
    lm._check_input_ids(torch.full((16,), 100), 64)


def test_every_forward_documents_its_shapes_and_errors():
    """Before: help(PackedTransformer.forward) showed nn.Module's "Define the computation performed
    at every call" text."""
    for model in _both_models():
        doc = type(model).forward.__doc__
        assert doc is not None and doc is not torch.nn.Module.forward.__doc__
        for words in ("int64 ``[T]``", "int32 ``[N + 1]``", "max_seqlen", "``[T, vocab_size]``", "Raises:"):
            assert words in doc, (type(model).__name__, words)


def test_model_sizes_are_checked_where_the_model_is_built():
    # PackedLM built an embedding of 0 rows for vocab_size=0 and failed inside torch for -1, 2.5
    # or True; PackedTransformer checked vocab_size but computed its MLP width from an unchecked
    # mlp_ratio and dim (NaN: 'cannot convert float NaN to integer'; -1: 'hidden must be ...').
    for bad, error in ((0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match=f"vocab_size must be an int >= 1, got {bad!r}"):
            PackedLM(bad, 32, 2)
    for bad, error in ((float("nan"), ValueError), (-1, ValueError), ("2", TypeError), (None, TypeError)):
        with pytest.raises(error, match=r"mlp_ratio must be a finite real number >= 0"):
            PackedTransformer(10, 32, 2, 1, mlp_ratio=bad)
    with pytest.raises(ValueError, match=r"mlp_ratio must give a hidden width int\(mlp_ratio \* dim\) >= 1, "
                                         r"got mlp_ratio=0.01 with dim=32: 0"):
        PackedTransformer(10, 32, 2, 1, mlp_ratio=0.01)
    with pytest.raises(TypeError, match="VarLenAttention: dim must be an int, got str '32'"):
        PackedTransformer(10, "32", 2, 1)
    # The width is still mlp_ratio * dim rounded up to a multiple of 64.
    model = PackedTransformer(10, 32, 2, 1, mlp_ratio=2.5)
    assert model.blocks[0].down.in_features == math.ceil(2.5 * 32 / 64) * 64


def test_rope_base_is_checked_at_construction():
    # rope_base='x' was stored and failed at the first forward, inside rotary_tables.
    with pytest.raises(TypeError, match="rope_base must be a finite real number > 1.0, got 'x'"):
        VarLenAttention(32, 2, rotary=True, rope_base="x")
    with pytest.raises(ValueError, match="rope_base must be a finite real number > 1.0, got 0.5"):
        VarLenAttention(32, 2, rotary=True, rope_base=0.5)
    assert VarLenAttention(32, 2, rotary=True, rope_base=500).rope_base == 500.0


@pytest.mark.parametrize("build", [
    lambda **f: VarLenAttention(32, 2, **f),
    lambda **f: PackedLM(10, 32, 2, **f),
    lambda **f: PackedTransformer(10, 32, 2, 1, **f),
    lambda **f: ShortConvAttentionBlock(32, 2, **f),
], ids=["VarLenAttention", "PackedLM", "PackedTransformer", "ShortConvAttentionBlock"])
def test_models_refuse_a_device_or_dtype_by_name(build):
    # A bad device reached nn.Linear / nn.Embedding: torch's RuntimeError "Expected one of cpu,
    # cuda, ... device type at start of device string: foo", an AssertionError "Torch not compiled
    # with CUDA enabled" for "cuda" without a GPU, "Cannot access accelerator device" for 0; an
    # integer dtype a RuntimeError from the initialiser.
    with pytest.raises(ValueError, match=r"device must be a torch.device, a device string .*, got 'foo'"):
        build(device="foo")
    with pytest.raises(TypeError, match=r"device must be a torch.device, a device string .*, got bool True"):
        build(device=True)
    with pytest.raises(TypeError, match=r"dtype must be a floating torch.dtype or None, got torch.int64"):
        build(dtype=torch.int64)
    if not torch.cuda.is_available():
        for bad in ("cuda", 0, torch.device("cuda:1")):
            with pytest.raises(ValueError, match=r"device must be .*available"):
                build(device=bad)
    model = build(device="meta")  # meta is meaningful for a model: shapes without memory
    assert all(p.is_meta for p in model.parameters())
    assert all(p.dtype == torch.float64 for p in build(device=torch.device("cpu"), dtype=torch.float64).parameters())


@pytest.mark.parametrize("build", [
    lambda: VarLenAttention(32, 2, impl="reference"),
    lambda: ShortConvAttentionBlock(32, 2, impl="reference"),
], ids=["VarLenAttention", "ShortConvAttentionBlock"])
def test_forward_names_a_bad_x(build):
    # x was used unchecked: a list gave AttributeError ('list' object has no attribute 'shape'),
    # a wrong width or dtype torch's "mat1 and mat2 shapes cannot be multiplied" / "expected m1
    # and m2 to have the same dtype", a 1-D x "shape '[32, 3, 2, 16]' is invalid".
    module = build()
    cu = torch.tensor([0, 3], dtype=torch.int32)
    cases = [
        ([[0.0] * 32] * 3, TypeError, r"x must be a torch.Tensor of shape \[T, 32\], got list"),
        (torch.randn(3, 16), ValueError, r"x must have shape \[T, 32\] \(dim\), got \(3, 16\)"),
        (torch.randn(32), ValueError, r"x must have shape \[T, 32\], got shape \(32,\)"),
        (torch.randn(3, 32, dtype=torch.float64), TypeError, r"x must have dtype float32, got torch.float64"),
        (torch.randn(3, 32, device="meta"), ValueError, r"x must be on device cpu, got meta"),
    ]
    for x, error, match in cases:
        with pytest.raises(error, match=match):
            module(x, cu)
    if isinstance(module, VarLenAttention):  # autocast casts at the projection: accepted
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert module(torch.randn(3, 32, dtype=torch.bfloat16), cu).shape == (3, 32)


@pytest.mark.parametrize("build", [lambda: PackedLM(10, 32, 2, impl="reference"),
                                   lambda: PackedTransformer(10, 32, 2, 1, impl="reference")],
                         ids=["PackedLM", "PackedTransformer"])
def test_loss_refuses_a_cpu_mask_past_the_active_rows(build):
    # A CPU loss_mask True past L = cu_seqlens[-1] was silently counted: the mean included the
    # logits of rows past the batch (PackedBatch refuses such a mask; a direct call did not).
    torch.manual_seed(0)
    model = build().double()
    ids, labels = torch.randint(0, 10, (8,)), torch.randint(0, 10, (8,))
    cu = torch.tensor([0, 3, 5, 5], dtype=torch.int32)
    mask = torch.ones(8, dtype=torch.bool)
    with pytest.raises(ValueError, match=re.escape(
            "loss_mask must be False on the inactive rows L..T-1 = 5..7 (L = cu_seqlens[-1]; the loss would "
            "count rows past the batch), got loss_mask[5] = True (3 such rows)")):
        model.loss(ids, labels, mask, cu)
    mask[5:] = False
    mask[1] = False  # rows before L may be left out
    logits = model(ids, cu)
    expected = sum(F.cross_entropy(logits[r:r + 1], labels[r:r + 1]) for r in (0, 2, 3, 4)) / 4
    torch.testing.assert_close(model.loss(ids, labels, mask, cu), expected)


def test_models_refuse_a_head_dim_rotary_cannot_use_and_a_float_dim_when_built():
    """Break-it (reliability tail). Before: PackedTransformer(100, 6, 2, 1), TransformerBlock(6, 2, ...)
    and VarLenAttention(6, 2, rotary=True) (head dim 3) were built and failed at the first forward
    with "head_dim must be an even int >= 2, got 3", naming neither dim nor num_heads;
    PackedLM(100, 32.0, 2) failed inside nn.Embedding ("empty(): argument 'size' ...")."""
    from attn_gym_lite.models import PackedLM, PackedTransformer, VarLenAttention
    from attn_gym_lite.models.lm import TransformerBlock

    odd = (r"^VarLenAttention: rotary position embeddings need an even head dim dim // num_heads, "
           r"got dim=6, num_heads=2: head dim 3$")
    for build in (lambda: PackedTransformer(100, 6, 2, 1), lambda: VarLenAttention(6, 2, rotary=True),
                  lambda: TransformerBlock(6, 2, 16, impl="auto", schedule="auto")):
        with pytest.raises(ValueError, match=odd):
            build()
    # Without rotary an odd head dim is fine (the reference attention takes any), and so is
    # PackedLM, whose attention has no rotary.
    assert VarLenAttention(6, 2).head_dim == 3 and PackedLM(100, 6, 2).attention.head_dim == 3
    with pytest.raises(TypeError, match=r"^VarLenAttention: dim must be an int, got float 32.0$"):
        PackedLM(100, 32.0, 2)
