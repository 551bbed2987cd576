"""The workload batches every training suite uses (attn_gym_lite.bench.end_to_end.workload_batches):
one GPU's are the end-to-end suite's, each data-parallel rank's come from its own shard."""

import itertools

import torch

from attn_gym_lite.bench.end_to_end import workload_batches
from attn_gym_lite.bench.scale_out import CPU_CONFIG
from attn_gym_lite.data import BestFit, PackedLoader, fixed_count_loader, load_tokenizer
from attn_gym_lite.data.corpora import python_stdlib_corpus

CONFIG = {**CPU_CONFIG, "T": 96, "sft_documents": 3, "sft_corpus_documents": 24}  # small: which documents land where


def test_one_builder_gives_the_single_gpu_batches_and_each_ranks_shard():
    tokenizer = load_tokenizer()
    documents = list(python_stdlib_corpus(limit=CONFIG["sft_corpus_documents"]))

    def sft(shard, seed):  # SFT batches drawn from one token stream of the shard's documents
        stream = torch.tensor([t for doc in tokenizer.encode_batch(shard) for t in doc], dtype=torch.int64)
        return list(fixed_count_loader(stream, 3, CONFIG["T"], CONFIG["sft_documents"],
                                       min_fill=CONFIG["sft_min_fill"], seed=seed))

    # W = 1: a PackedLoader over the whole corpus, and SFT from the first documents, seed unchanged.
    loader = PackedLoader(CONFIG["T"], corpus=python_stdlib_corpus, tokenizer=tokenizer,
                          policy=BestFit(CONFIG["pretraining_buffer"]), seed=CONFIG["seed"], epochs=None, prefetch=0,
                          pin_memory=False)
    expected = {"pretraining": list(itertools.islice(loader, 3)), "sft": sft(documents, CONFIG["seed"])}
    for workload, batches in expected.items():
        got = workload_batches(workload, 3, CONFIG, tokenizer=tokenizer)
        assert len(got) == 3
        for a, b in zip(got, batches):
            for name in ("input_ids", "labels", "loss_mask", "cu_seqlens"):
                assert torch.equal(getattr(a, name), getattr(b, name)), (workload, name)
    # Two ranks: SFT rank 1 draws from documents 1, 3, 5, ... only, with its own seed.
    rank1 = workload_batches("sft", 3, CONFIG, rank=1, world_size=2, tokenizer=tokenizer)
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(rank1, sft(documents[1::2], CONFIG["seed"] + 1)))
