"""Exact by default: every public module, built with its default arguments, gives on a padded batch
(``L < T``) the outputs on rows ``< L`` and the parameter gradients of the unpadded computation,
whatever the capacity rows ``L..T-1`` hold (NaN, inf, huge values).

The modules are found by walking the package (every ``nn.Module`` in an ``__all__``), so a new one
fails ``test_every_public_module_is_swept`` until it is built here. The reference is the same
module in float64, with its reference implementations, run on the ``L`` real rows alone.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import pkgutil

import pytest
import torch

import attn_gym_lite
from attn_gym_lite.models import PackedLM, PackedTransformer, ShortConvAttentionBlock, VarLenAttention
from attn_gym_lite.models.kda import KDAAttention
from attn_gym_lite.ops.short_conv import ShortConv

VOCAB = 37
DIM, HEADS = 32, 2
#: How to build each public module: its required arguments only, every option at its default.
BUILD = {
    "VarLenAttention": lambda **f: VarLenAttention(DIM, HEADS, **f),
    "ShortConvAttentionBlock": lambda **f: ShortConvAttentionBlock(DIM, HEADS, **f),
    "KDAAttention": lambda **f: KDAAttention(DIM, HEADS, head_dim=16, **f),
    "ShortConv": lambda **f: ShortConv(DIM, **f),
    "PackedLM": lambda **f: PackedLM(VOCAB, DIM, HEADS, **f),
    "PackedTransformer": lambda **f: PackedTransformer(VOCAB, DIM, HEADS, 2, **f),
}
#: Per implementation choice, the one the float64 reference uses.
REFERENCE_IMPL = {VarLenAttention: "reference", ShortConvAttentionBlock: "reference", KDAAttention: "recurrent",
                  ShortConv: "torch"}
LANGUAGE_MODELS = {"PackedLM", "PackedTransformer"}


def _public_modules() -> set[str]:
    found = set()
    for info in pkgutil.walk_packages(attn_gym_lite.__path__, prefix="attn_gym_lite."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and obj.__module__.startswith("attn_gym_lite"):
                found.add(obj.__name__)
    return found


def test_every_public_module_is_swept():
    assert _public_modules() == set(BUILD)


def _reference(module: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(module).double()
    for sub in ref.modules():
        if type(sub) in REFERENCE_IMPL:
            sub.impl = REFERENCE_IMPL[type(sub)]
    return ref


def _sweep(name: str, poison: float, device: str, dtype: torch.dtype, tolerance: float):
    torch.manual_seed(0)
    lengths, T = [5, 1, 9, 0], 24  # L = 15: an empty sequence, a one-token one, 9 capacity rows
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    L = int(cu[-1])
    module = BUILD[name](device=device, dtype=dtype)
    with torch.no_grad():  # weights large enough that a wrong row shows
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    reference = _reference(module)

    if name in LANGUAGE_MODELS:
        ids = torch.randint(0, VOCAB, (T,), device=device)
        labels = torch.randint(0, VOCAB, (T,), device=device)
        mask = torch.arange(T, device=device) < L - 1
        run = lambda m, rows, cu_: m.loss(ids[:rows], labels[:rows], mask[:rows], cu_)
        out, expected = run(module, T, cu), run(reference, L, cu)
        out.backward()
        expected.backward()
    else:
        x = torch.randn(T, DIM, device=device, dtype=torch.float64)
        weights = torch.randn(L, DIM, device=device, dtype=torch.float64)
        padded = x.to(dtype)
        padded[L:] = poison
        out = module(padded, cu)[:L]
        expected = reference(x[:L], cu)
        (out.double() * weights).sum().backward()
        (expected * weights).sum().backward()
    torch.testing.assert_close(out.double(), expected, atol=tolerance, rtol=tolerance)
    for (pname, p), r in zip(module.named_parameters(), reference.parameters()):
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}.{pname}: gradient not finite"
        scale = r.grad.abs().max().clamp_min(1)
        torch.testing.assert_close(p.grad.double() / scale, r.grad / scale, atol=tolerance, rtol=0,
                                   msg=lambda m: f"{name}.{pname}: {m}")


POISONS = [float("nan"), float("inf"), 1e30]


@pytest.mark.parametrize("poison", POISONS, ids=["nan", "inf", "huge"])
@pytest.mark.parametrize("name", sorted(BUILD))
def test_defaults_are_exact_on_a_padded_batch(name, poison):
    _sweep(name, poison, "cpu", torch.float32, 2e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("poison", POISONS, ids=["nan", "inf", "huge"])
@pytest.mark.parametrize("name", sorted(BUILD))
def test_defaults_are_exact_on_a_padded_batch_on_the_gpu(name, poison):
    # bfloat16 rounds a weight gradient summed over the rows to a few percent; a leaked capacity row
    # gives inf, NaN or an error of its own size (1e30).
    _sweep(name, poison, "cuda", torch.bfloat16, 0.1)
