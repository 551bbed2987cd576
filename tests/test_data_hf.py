"""Tests for attn_gym_lite.data.hf_dataset_texts: the real streaming code path of HF ``datasets``,
run offline on small local JSONL and Parquet samples (the same function readers point at the Hub).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attn_gym_lite.data import hf_dataset_texts, jsonl_texts, parquet_texts

pytest.importorskip("datasets")

TINY_JSONL = Path(__file__).parent / "fixtures" / "tiny.jsonl"


@pytest.fixture(autouse=True)
def offline_cache(tmp_path, monkeypatch):
    # Keep datasets away from the network and from the user's cache.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def test_streams_local_jsonl_like_the_jsonl_reader():
    texts = list(hf_dataset_texts("json", data_files=str(TINY_JSONL)))
    assert texts == list(jsonl_texts(TINY_JSONL))  # nulls and blank lines skipped the same way
    assert len(texts) == 3


def test_streams_local_parquet_like_the_parquet_reader(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = ["first", None, "Ünïcödé ✓", "", "last"]
    path = tmp_path / "sample.parquet"
    pq.write_table(pa.table({"body": pa.array(rows, pa.string())}), path, row_group_size=2)
    texts = list(hf_dataset_texts("parquet", data_files=str(path), field="body"))
    assert texts == list(parquet_texts(path, column="body")) == ["first", "Ünïcödé ✓", "", "last"]
