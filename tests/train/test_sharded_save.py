"""save_sharded (huggingface_hub's split, our atomic writes) and read_header (safetensors' safe_open)."""

from __future__ import annotations

import json

import torch

from kohakumoss_common.io import INDEX_SUFFIX, load_tensors, read_header, save_sharded


def test_shards_stay_under_the_limit_and_the_index_maps_every_key(tmp_path):
    tensors = {f"w{i}": torch.full((100,), float(i)) for i in range(5)} | {
        "bf": torch.ones(3, dtype=torch.bfloat16)
    }
    paths = save_sharded(tensors, tmp_path, "m", max_shard_bytes=900, metadata={"format": "pt"})
    assert [p.name for p in paths] == [f"m-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert all(p.stat().st_size < 900 + 400 for p in paths)  # 400: a header's room
    index = json.loads((tmp_path / f"m{INDEX_SUFFIX}").read_text())
    assert set(index["weight_map"]) == set(tensors) and index["metadata"] == {
        "total_size": 2006,
        "format": "pt",
    }
    entries, metadata = read_header(tmp_path)
    assert entries["bf"] == ("BF16", [3]) and entries["w0"] == ("F32", [100]) and metadata == {"format": "pt"}
    assert all(torch.equal(load_tensors(tmp_path)[k], t) for k, t in tensors.items())


def test_no_tensors_write_one_empty_file(tmp_path):
    assert [p.name for p in save_sharded({}, tmp_path, "m", metadata={"a": "b"})] == ["m.safetensors"]
    assert read_header(tmp_path / "m.safetensors") == ({}, {"a": "b"})
