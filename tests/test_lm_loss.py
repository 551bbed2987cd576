"""packed_lm_loss and token_loss_sum: one loss, defined in the models layer, checked against a
naive float64 loop of -log_softmax row by row."""

import math

import pytest
import torch

import attn_gym_lite.graph.distributed as distributed
from attn_gym_lite.models import PackedLM, packed_lm_loss, token_loss_sum
from attn_gym_lite.models import lm as lm_module
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


def test_half_precision_is_averaged_in_float32():
    logits, labels, mask = _batch(5)
    expected, _ = naive_mean_loss(logits.float(), labels, mask)
    assert packed_lm_loss(logits.float(), labels, mask).dtype == torch.float32
    for dtype in (torch.float16, torch.bfloat16):
        rounded = logits.to(dtype)
        loss = packed_lm_loss(rounded, labels, mask)
        assert loss.dtype == torch.float32
        assert loss.item() == pytest.approx(naive_mean_loss(rounded.double(), labels, mask)[0], rel=1e-5)
    assert packed_lm_loss(logits.float(), labels, mask).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("stray", [10**6, -7, -100, VOCAB])
def test_a_stray_label_on_an_unselected_row_changes_nothing(stray):
    """Before: cross_entropy gathered every row's label, so an out-of-range one on a masked-out
    row raised IndexError on the CPU (a device-side assert on CUDA)."""
    logits, labels, mask = _batch(1)
    unselected = int(torch.nonzero(~mask)[0])
    stale = labels.clone()
    stale[unselected] = stray
    garbage = logits.clone()
    garbage[unselected] = float("nan")  # selected away, never multiplied by 0
    clean = packed_lm_loss(logits, labels, mask)
    assert torch.equal(packed_lm_loss(garbage, stale, mask), clean)
    assert clean.item() == pytest.approx(naive_mean_loss(logits, labels, mask)[0], rel=1e-12)


def test_an_ignorable_label_on_a_selected_row_is_an_error_not_a_zero_loss():
    """Before: cross_entropy's default ignore_index=-100 made that row a zero loss that still
    counted in the denominator, a silently smaller mean; then torch's bare
    'IndexError: Target -100 is out of bounds', naming neither the argument nor the row."""
    logits, labels, mask = _batch(2)
    labels[0] = -100  # row 0 is selected
    with pytest.raises(ValueError, match=r"labels must be in \[0, V\) = \[0, 7\) \(V = logits.shape\[1\]\) on the rows "
                                         r"loss_mask selects, got labels\[0\] = -100 where loss_mask\[0\] is True "
                                         r"\(1 such rows\); rows without a target are excluded by loss_mask, not by -100"):
        packed_lm_loss(logits, labels, mask)
    labels[0] = VOCAB  # one past the vocabulary: no hint about -100
    with pytest.raises(ValueError, match=r"got labels\[0\] = 7 where loss_mask\[0\] is True \(1 such rows\)$"):
        packed_lm_loss(logits, labels, mask)


@pytest.mark.parametrize("stray", [-1, -100, VOCAB, 10**6])
def test_every_out_of_range_selected_label_is_named_with_its_first_row(stray):
    logits, labels, mask = _batch(6)
    rows = [int(t) for t in torch.nonzero(mask).flatten()][-2:]  # the last two selected rows
    for row in rows:
        labels[row] = stray
    with pytest.raises(ValueError, match=rf"got labels\[{rows[0]}\] = {stray} where loss_mask\[{rows[0]}\] is True "
                                         r"\(2 such rows\)"):
        token_loss_sum(logits, labels, mask)
    # The largest and smallest in-range labels pass: the bound is exactly V = logits.shape[1].
    labels[rows[0]], labels[rows[1]] = 0, VOCAB - 1
    total, _ = token_loss_sum(logits, labels, mask)
    assert total.item() == pytest.approx(naive_mean_loss(logits, labels, mask)[0] * int(mask.sum()), rel=1e-12)


def test_labels_off_the_cpu_are_not_read(monkeypatch):
    """Documented: on CUDA the labels are not checked (reading them would sync, and cannot happen
    during a capture); a meta tensor stands in for a device tensor here: it has no values to read."""
    read = []
    monkeypatch.setattr(lm_module, "_check_selected_labels", lambda *args: read.append(args))
    logits, labels, mask = _batch(7)
    token_loss_sum(logits.to("meta"), labels.to("meta"), mask.to("meta"))
    assert read == []
    token_loss_sum(logits, labels, mask)
    assert len(read) == 1


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


def test_packed_lm_loss_checks_its_arguments():
    logits, labels, mask = torch.zeros(4, VOCAB), torch.zeros(4, dtype=torch.int64), torch.ones(4, dtype=torch.bool)
    cases = [
        ((labels.reshape(4, 1), labels, mask), TypeError, "logits must have dtype float16, bfloat16, float32, float64, got torch.int64"),
        ((logits[0], labels, mask), ValueError, r"logits must have shape \[T, V\], got shape \(7,\)"),
        ((logits[:, :0], labels, mask), ValueError, r"logits must have shape \[T, V\] with V >= 1 .*got shape \(4, 0\)"),
        ((logits, labels.int(), mask), TypeError, "labels must have dtype int64, got torch.int32"),
        ((logits, labels.tolist(), mask), TypeError, r"labels must be a torch.Tensor of shape \[T\], got list"),
        ((logits, labels, labels), TypeError, "loss_mask must have dtype bool, got torch.int64"),
        ((logits, labels[:3], mask), ValueError, r"same T rows, got \(4, 7\), \(3,\) and \(4,\)"),
        ((logits, labels, mask.to("meta")), ValueError, "loss_mask must be on device cpu, got meta"),
    ]
    for arguments, error, message in cases:
        with pytest.raises(error, match=message):
            packed_lm_loss(*arguments)


def test_one_definition_in_the_models_layer():
    assert distributed.token_loss_sum is lm_module.token_loss_sum is token_loss_sum
    assert "token_loss_sum" in distributed.__all__
    assert not hasattr(distributed, "_NO_IGNORED_LABEL")


def _small_batch():
    """A float64 one-block model and a T = 8 batch of two sequences (3 and 2 tokens, N = 3) with
    random ids and labels; rows 0, 1 and 3 counted."""
    torch.manual_seed(0)
    model = PackedLM(VOCAB, 8, 2, impl="reference").double()
    cu = pad_cu_seqlens(cu_seqlens_from_lengths([3, 2]), 3)
    ids = torch.randint(VOCAB, (8,))
    labels = torch.randint(VOCAB, (8,))
    mask = torch.tensor([1, 1, 0, 1, 0, 0, 0, 0], dtype=torch.bool)
    return model, cu, ids, labels, mask


def test_model_loss_ignores_stale_labels_past_the_active_rows():
    """The model's loss goes through packed_lm_loss: labels on inactive capacity rows can be
    anything (a recycled static buffer), the loss is that of the active rows alone."""
    model, cu, ids, labels, mask = _small_batch()
    stale = labels.clone()
    stale[5:] = torch.tensor([-1, 10**9, -100])
    loss = model.loss(ids, stale, mask, cu, 3)
    logits = model(ids, cu, 3).detach()
    assert loss.item() == pytest.approx(naive_mean_loss(logits, labels, mask)[0], rel=1e-12)


@pytest.mark.parametrize("stray", [VOCAB, 99999, -1])
def test_model_loss_names_an_input_id_outside_the_vocabulary(stray):
    """Before: an id past the vocabulary failed in the embedding with torch's bare IndexError
    ("index out of range in self"), naming neither input_ids nor the row."""
    model, cu, ids, labels, mask = _small_batch()
    bad = ids.clone()
    bad[[4, 6]] = stray
    with pytest.raises(ValueError, match=rf"^input_ids must be token ids in \[0, V\) = \[0, {VOCAB}\) \(V = the "
                                         rf"embedding's vocabulary\), got input_ids\[4\] = {stray} \(2 such rows\)$"):
        model.loss(bad, labels, mask, cu, 3)
    # Every id in range, the largest included: the loss is the naive mean of the active rows.
    ids[4] = VOCAB - 1
    loss = model.loss(ids, labels, mask, cu, 3)
    assert loss.item() == pytest.approx(naive_mean_loss(model(ids, cu, 3).detach(), labels, mask)[0], rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(dim=30, num_heads=4, hidden=64), ValueError,
         r"^VarLenAttention: dim must be a positive multiple of num_heads, got dim=30, num_heads=4$"),
        # Before: "dim must be a positive multiple of num_heads, got dim=32.0", which 32.0 is.
        (dict(dim=32.0, num_heads=4, hidden=64), TypeError, r"^VarLenAttention: dim must be an int, got float 32.0$"),
        (dict(dim=32, num_heads=True, hidden=64), TypeError, r"^VarLenAttention: num_heads must be an int, got bool True$"),
        (dict(dim=32, num_heads=4, hidden=0), ValueError, r"^hidden must be an int >= 1, got 0$"),
        (dict(dim=32, num_heads=4, hidden=-1), ValueError, r"^hidden must be an int >= 1, got -1$"),
        (dict(dim=32, num_heads=4, hidden=64.0), TypeError, r"^hidden must be an int >= 1, got 64.0$"),
        (dict(dim=32, num_heads=4, hidden=True), TypeError, r"^hidden must be an int >= 1, got True$"),
        (dict(dim=32, num_heads=4, hidden=64, impl="nope"), ValueError, r"^impl must be one of .*, got 'nope'$"),
        (dict(dim=32, num_heads=2, hidden=64, impl="triton", schedule="nope"), ValueError,
         r"^schedule must be one of .*, got 'nope'$"),
    ],
)
def test_transformer_block_checks_its_sizes(kwargs, error, message):
    kwargs = {"impl": "reference", "schedule": "auto", **kwargs}
    with pytest.raises(error, match=message):
        lm_module.TransformerBlock(**kwargs)
