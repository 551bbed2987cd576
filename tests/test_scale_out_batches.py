"""The workload batches every training suite uses (attn_gym_lite.bench.end_to_end.workload_batches):
one GPU's are the end-to-end suite's, each data-parallel rank's come from its own shard."""

import itertools

import torch

from attn_gym_lite.bench.end_to_end import workload_batches
from attn_gym_lite.bench.scale_out import CPU_CONFIG
from attn_gym_lite.data import BestFit, PackedLoader, fixed_count_loader, load_tokenizer
from attn_gym_lite.data.corpora import python_stdlib_corpus

#: Small: the test is about which documents land in which batch.
TINY = {**CPU_CONFIG, "T": 96, "sft_documents": 3, "sft_corpus_documents": 24}


def test_one_builder_gives_the_single_gpu_batches_and_each_ranks_shard():
    config = TINY
    tokenizer = load_tokenizer()
    # W = 1 is the end-to-end suite's batches: a PackedLoader over the whole corpus, and the SFT
    # draw from the first sft_corpus_documents documents, seed unchanged.
    loader = PackedLoader(config["T"], corpus=python_stdlib_corpus, tokenizer=tokenizer,
                          policy=BestFit(config["pretraining_buffer"]), seed=config["seed"], epochs=None, prefetch=0,
                          pin_memory=False)
    ids = tokenizer.encode_batch(list(python_stdlib_corpus(limit=config["sft_corpus_documents"])))
    stream = torch.tensor([t for doc in ids for t in doc], dtype=torch.int64)
    expected = {"pretraining": list(itertools.islice(loader, 3)),
                "sft": list(fixed_count_loader(stream, 3, config["T"], config["sft_documents"],
                                               min_fill=config["sft_min_fill"], seed=config["seed"]))}
    for workload, batches in expected.items():
        got = workload_batches(workload, 3, config, tokenizer=tokenizer)
        assert len(got) == 3
        for a, b in zip(got, batches):
            for name in ("input_ids", "labels", "loss_mask", "cu_seqlens"):
                assert torch.equal(getattr(a, name), getattr(b, name)), (workload, name)
    # Two ranks: SFT rank 1 draws from documents 1, 3, 5, ... only (its token stream is theirs).
    odd = tokenizer.encode_batch(list(python_stdlib_corpus(limit=config["sft_corpus_documents"]))[1::2])
    odd_stream = torch.tensor([t for doc in odd for t in doc], dtype=torch.int64)
    rank1 = workload_batches("sft", 3, config, rank=1, world_size=2, tokenizer=tokenizer)
    reference = list(fixed_count_loader(odd_stream, 3, config["T"], config["sft_documents"],
                                        min_fill=config["sft_min_fill"], seed=config["seed"] + 1))
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(rank1, reference))
