"""packed_lm_loss, token_loss_sum and the models' loss against a float64 loop of -log_softmax."""

import math

import pytest
import torch

from attn_gym_lite.models import PackedLM, packed_lm_loss, token_loss_sum
from attn_gym_lite.ragged import cu_seqlens_from_lengths, pad_cu_seqlens

VOCAB = 7


def naive_mean_loss(logits, labels, mask):
    """Mean of -log_softmax(logits[t])[labels[t]] over the selected rows, in Python floats."""
    losses = []
    for t in range(logits.shape[0]):
        if not bool(mask[t]):
            continue
        row = [float(x) for x in logits[t]]
        peak = max(row)
        log_norm = peak + math.log(sum(math.exp(x - peak) for x in row))
        losses.append(log_norm - row[int(labels[t])])
    return sum(losses) / max(len(losses), 1), len(losses)


def _batch(seed, rows=9):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, VOCAB, dtype=torch.float64, generator=g) * 3
    labels = torch.randint(0, VOCAB, (rows,), generator=g)
    mask = torch.rand(rows, generator=g) < 0.6
    mask[0] = True
    return logits, labels, mask


@pytest.mark.parametrize("seed", range(4))
def test_packed_lm_loss_is_the_naive_mean_of_minus_log_softmax(seed):
    logits, labels, mask = _batch(seed)
    expected, count = naive_mean_loss(logits, labels, mask)
    loss = packed_lm_loss(logits, labels, mask)
    assert loss.dtype == torch.float64 and loss.dim() == 0
    assert loss.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    total, counted = token_loss_sum(logits, labels, mask)
    assert counted.dtype == torch.int64 and counted.item() == count
    assert total.item() == pytest.approx(expected * count, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_half_precision_is_averaged_in_float32(dtype):
    logits, labels, mask = _batch(5)
    rounded = logits.to(dtype)
    loss = packed_lm_loss(rounded, labels, mask)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(naive_mean_loss(rounded.double(), labels, mask)[0], rel=1e-5)


@pytest.mark.parametrize("stray", [10**6, -7, -100, VOCAB])
def test_a_stray_label_on_an_unselected_row_changes_nothing(stray):
    logits, labels, mask = _batch(1)
    unselected = int(torch.nonzero(~mask)[0])
    stale = labels.clone()
    stale[unselected] = stray
    garbage = logits.clone()
    garbage[unselected] = float("nan")  # selected away, never multiplied by 0
    clean = packed_lm_loss(logits, labels, mask)
    assert torch.equal(packed_lm_loss(garbage, stale, mask), clean)
    assert clean.item() == pytest.approx(naive_mean_loss(logits, labels, mask)[0], rel=1e-12)


def test_an_all_false_mask_gives_zero_not_nan():
    logits, labels, _ = _batch(3)
    labels[2] = -100  # nothing is selected, so nothing is read
    loss = packed_lm_loss(logits, labels, torch.zeros(labels.shape[0], dtype=torch.bool))
    assert loss.dtype == torch.float64 and loss.item() == 0.0
    empty = packed_lm_loss(torch.zeros(0, VOCAB), torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.bool))
    assert empty.item() == 0.0


def test_the_gradient_is_that_of_the_naive_mean():
    logits, labels, mask = _batch(4)
    logits.requires_grad_(True)
    packed_lm_loss(logits, labels, mask).backward()
    # d/dz of (logsumexp(z) - z[y]) / count is (softmax(z) - onehot(y)) / count on selected rows.
    count = int(mask.sum())
    expected = torch.zeros_like(logits)
    for t in range(logits.shape[0]):
        if mask[t]:
            row = [math.exp(float(x)) for x in logits.detach()[t]]
            norm = sum(row)
            for v in range(VOCAB):
                expected[t, v] = (row[v] / norm - (v == int(labels[t]))) / count
    torch.testing.assert_close(logits.grad, expected, rtol=1e-12, atol=1e-14)


def _small_batch():
    """A float64 PackedLM and a T = 8 batch of sequences of 3 and 2 tokens (N = 3); rows 0, 1, 3 counted."""
    torch.manual_seed(0)
    model = PackedLM(VOCAB, 8, 2, impl="reference").double()
    cu = pad_cu_seqlens(cu_seqlens_from_lengths([3, 2]), 3)
    ids = torch.randint(VOCAB, (8,))
    labels = torch.randint(VOCAB, (8,))
    mask = torch.tensor([1, 1, 0, 1, 0, 0, 0, 0], dtype=torch.bool)
    return model, cu, ids, labels, mask


def test_model_loss_ignores_stale_labels_past_the_active_rows():
    # Labels on capacity rows can be anything (a recycled static buffer).
    model, cu, ids, labels, mask = _small_batch()
    stale = labels.clone()
    stale[5:] = torch.tensor([-1, 10**9, -100])
    loss = model.loss(ids, stale, mask, cu, 3)
    logits = model(ids, cu, 3).detach()
    assert loss.item() == pytest.approx(naive_mean_loss(logits, labels, mask)[0], rel=1e-12)


# The mean would count a wrong row: with cross_entropy's usual ignore_index a -100 label on a counted
# row is a zero loss in the denominator (no label is ignorable here: torch refuses the target), and
# a counted row past L is capacity (a CPU mask is checked; a CUDA one would sync: PackedBatch checks it).
@pytest.mark.parametrize(("row", "label", "error", "match"), [(0, -100, IndexError, "Target -100"),
                                                              (6, 1, ValueError, "loss_mask")],
                         ids=["-100 on a counted row", "a counted row past L"])
def test_the_loss_refuses_a_row_that_would_change_the_mean_silently(row, label, error, match):
    model, cu, ids, labels, mask = _small_batch()
    mask[row], labels[row] = True, label
    with pytest.raises(error, match=match):
        model.loss(ids, labels, mask, cu, 3)
