"""A transformer whose activations at its upper bounds are too big to lay out whole is laid out for a chunk of samples,
and the executable runs a larger batch chunk by chunk (kernel/dynamic.py: batch_chunk; runtime/executable.py:
_run_chunks) — instead of one sample at a time, each sample reading every weight again. Checked against
onnxruntime (rtol 1e-4, as the other dynamic tests) on both sides of every chunk boundary."""
from __future__ import annotations

import numpy as np
import pytest
from test_dynamic_kernels import RTOL, _feeds, attention_model, batch_mixing_model, conv_model

import kiln
import kiln.kernel.dynamic as dynamic
from conftest import assert_close, run_ort, width_runs
from kiln.frontend.onnx import import_onnx

BIG = {"batch": (1, 2048), "seq": (1, 512)}  # attention scores at the bounds: 2048 × 512 × 512 floats = 2 GiB


def test_chunk_only_where_one_sample_at_a_time_was_chosen_for_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1 MiB of scores per sample at 512 tokens: 128 samples within CHUNK_VALUE_BYTES (128 MiB)
    assert dynamic.batch_chunk(import_onnx(attention_model(), dynamic_bounds=BIG)) == \
        dynamic.BatchChunk("batch", 128, (1, 2048))
    monkeypatch.setattr(dynamic, "CHUNK_VALUE_BYTES", 5 << 19)  # 2.5 MiB: two samples
    assert dynamic.batch_chunk(import_onnx(attention_model(), dynamic_bounds=BIG)).samples == 2
    assert dynamic.batch_chunk(import_onnx(attention_model())) is None          # whole at its bounds: no chunks
    assert dynamic.batch_chunk(import_onnx(conv_model())) is None               # a CNN keeps one sample at a time
    assert dynamic.batch_chunk(import_onnx(batch_mixing_model())) is None       # a Softmax over the batch: whole
    monkeypatch.setattr(dynamic, "CHUNK_VALUE_BYTES", 1 << 19)  # not even two samples fit: one at a time
    assert dynamic.batch_chunk(import_onnx(attention_model(), dynamic_bounds=BIG)) is None


def test_a_batch_too_big_to_lay_out_whole_runs_in_chunks(width: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dynamic, "CHUNK_VALUE_BYTES", 5 << 19)  # chunks of two samples, so a test batch spans several
    model = attention_model()
    if not width_runs(width):
        from kiln.compiler import lower
        from kiln.target import resolve
        c = lower(model, resolve(width), 2, {}, dynamic_bounds=BIG, stop_after="object")
        assert c.chunk == dynamic.BatchChunk("batch", 2, (1, 2048)) and c.obj[:4] == b"\x7fELF"
        return
    exe = kiln.compile(model, target=width, num_threads=2, cache=False, dynamic_bounds=BIG)
    d = exe.meta["dynamic"]
    assert d["chunk"] == {"symbol": "batch", "samples": 2, "bounds": [1, 2048]}
    assert d["bounds"]["batch"] == [1, 2] and d["per_sample"] is None  # laid out whole for two samples
    for i, size in enumerate([{"batch": 1, "seq": 1}, {"batch": 2, "seq": 5}, {"batch": 3, "seq": 17},
                              {"batch": 5, "seq": 2}, {"batch": 4, "seq": 33}]):
        feeds = _feeds(model, size, i)
        profile: dict[str, float] = {}
        got, want = exe.run(feeds, profile=profile), run_ort(model, feeds)
        for j, (g, w) in enumerate(zip(got, want)):
            assert g.shape == w.shape
            assert_close(g, w, RTOL, f"size {size} output {j}")
        assert profile and all(v > 0 for v in profile.values())
    with pytest.raises(ValueError, match=r"'batch' = 2049 \(from input .*\) is outside the bounds \[1, 2048\]"):
        exe.run({"x": np.zeros((2049, 1, 32), np.float32)})
    with pytest.raises(ValueError, match="rank"):
        exe.run({"x": np.zeros((3, 32), np.float32)})


def test_a_saved_executable_keeps_its_chunks(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    monkeypatch.setattr(dynamic, "CHUNK_VALUE_BYTES", 5 << 19)
    model = attention_model()
    exe = kiln.compile(model, num_threads=2, cache=False, dynamic_bounds=BIG)
    exe.save(str(tmp_path / "m.kiln"))
    loaded = kiln.load(str(tmp_path / "m.kiln"))
    assert loaded.meta["dynamic"] == exe.meta["dynamic"] and loaded.meta["dynamic"]["chunk"]["samples"] == 2
    feeds = _feeds(model, {"batch": 5, "seq": 9}, 7)
    for got, want in zip(loaded.run(feeds), exe.run(feeds)):
        np.testing.assert_array_equal(got, want)
