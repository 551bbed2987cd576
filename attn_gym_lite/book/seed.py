"""Figures the seed article ("So you wanna CUDA Graph") published: citations shown beside our
measurements, never ours."""

#: Its packing figures (section "Show me the data!").
SEED_PUBLISHED = {
    "source": 'seed article "So you wanna CUDA Graph", section "Show me the data!"',
    "setup": ("the article's own measurements (its GPU figures are from an NVIDIA B200, torch 2.15 "
              "nightly, CUDA 13.2); packing statistics depend on the data, not the GPU"),
    "policy": "look-ahead packing with a candidate buffer (the article does not name the rule)",
    "corpora": {
        "Dolma 3": {
            "sample": "20,000 source rows of the OLMo 3 7B stage-1 mix, OLMo 3 tokenizer",
            "max_piece_tokens": 8192,
            "rows": [{"T": 8192, "B": 32, "median_M": 1, "p99_M": 13, "mean_fill": 0.9980, "mean_padding": 16},
                     {"T": 16384, "B": 32, "median_M": 4, "p99_M": 32, "mean_fill": 0.9975, "mean_padding": 40}],
        },
        "FineWeb sample-10BT": {
            "sample": "FineWeb sample-10BT, tiktoken o200k_base (not tokenizer-controlled)",
            "max_piece_tokens": None,
            "rows": [{"T": 16384, "B": 32, "mean_fill": 1 - 0.088}, {"T": 16384, "B": 64, "mean_fill": 1 - 0.007}],
        },
    },
}

#: Its module-level Amdahl study of KDA (section "A real KDA module"): the core's and the whole
#: module's time at full capacity and at half the tokens.
SEED_KDA_MODULE = {
    "source": 'seed article "So you wanna CUDA Graph", section "A real KDA module"',
    "setup": "NVIDIA B200; KDAAttention with T_max = 4096, N = 32, hidden size 2304, 32 KDA heads; forward + backward",
    "points": [{"T": 4096, "core_ms": 1.23, "module_ms": 3.43}, {"T": 2048, "core_ms": 0.77, "module_ms": 2.91}],
    # As the article states them (recomputed from the rounded ms above they would read 37 % and 15 %).
    "core_drop": 0.38,
    "module_drop": 0.15,
}
