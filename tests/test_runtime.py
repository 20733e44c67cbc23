"""Runtime and error paths: feeds validation, save/load, the compile cache, threads, bad models."""
from __future__ import annotations

import os
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.compiler import finish_cache_writes


def small_model(op: str = "Relu", opset: int = 17, **attrs: object) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 19])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 19])
    w = numpy_helper.from_array(np.linspace(-1, 1, 19, dtype=np.float32), "w")
    nodes = [helper.make_node("Add", ["x", "w"], ["t"], name="add0"),
             helper.make_node(op, ["t"], ["y"], name="act0", **attrs)]
    g = helper.make_graph(nodes, "small", [x], [y], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.fixture()
def exe() -> kiln.Executable:
    return kiln.compile(small_model(), num_threads=2, cache=False)


def test_runs_and_matches_numpy(exe: kiln.Executable) -> None:
    x = np.random.default_rng(0).standard_normal((2, 19)).astype(np.float32)
    (y,) = exe.run({"x": x})
    np.testing.assert_allclose(y, np.maximum(x + np.linspace(-1, 1, 19, dtype=np.float32), 0), rtol=1e-6)


@pytest.mark.parametrize("feeds, message", [
    ({"z": np.zeros((2, 19), np.float32)}, "unknown input name"),
    ({}, "missing input 'x'"),
    ({"x": np.zeros((2, 18), np.float32)}, "expected [2, 19]"),
    ({"x": np.zeros((2, 19), np.float64)}, "expected float32"),
])
def test_bad_feeds_say_what_was_expected(exe: kiln.Executable, feeds: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        exe.run(feeds)


def test_non_contiguous_input_is_accepted(exe: kiln.Executable) -> None:
    x = np.random.default_rng(1).standard_normal((19, 2)).astype(np.float32).T
    (y,) = exe.run({"x": x})
    np.testing.assert_allclose(y, np.maximum(x + np.linspace(-1, 1, 19, dtype=np.float32), 0), rtol=1e-6)


def test_read_only_input_is_accepted(exe: kiln.Executable) -> None:
    """A read-only array (np.frombuffer of bytes) has no writable buffer to take the address from (run's fast
    path): its address comes through ctypes; the same run on a writable copy agrees, and so does NumPy."""
    x = np.random.default_rng(2).standard_normal((2, 19)).astype(np.float32)
    frozen = np.frombuffer(x.tobytes(), dtype=np.float32).reshape(2, 19)
    assert not frozen.flags.writeable
    (y,) = exe.run({"x": frozen})
    np.testing.assert_array_equal(y, exe.run({"x": x.copy()})[0])
    np.testing.assert_allclose(y, np.maximum(x + np.linspace(-1, 1, 19, dtype=np.float32), 0), rtol=1e-6)


def test_save_and_load_without_recompiling(exe: kiln.Executable, tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "m.kiln")
    exe.save(path)
    x = np.random.default_rng(2).standard_normal((2, 19)).astype(np.float32)
    loaded = kiln.load(path)
    np.testing.assert_array_equal(loaded.run({"x": x})[0], exe.run({"x": x})[0])
    assert loaded.input_names == ["x"] and loaded.output_names == ["y"]


def test_save_and_load_each_width(width: str, tmp_path) -> None:  # noqa: ANN001
    """A .kiln compiled for a narrower x86 width of this host (`kiln compile --target avx2` on an AVX-512 host) loads
    and runs here, as kiln.compile(target=width) runs (load compared the key with the host's alone and refused it);
    one for another machine's target is refused at load, naming both."""
    import json
    import zipfile

    from conftest import emit_only, width_runs

    if not width_runs(width):
        emit_only(small_model(), width)
        pytest.skip(f"{width}: emitted only, this host cannot run it")
    exe = kiln.compile(small_model(), target=width, num_threads=2, cache=False)
    path = str(tmp_path / f"{width}.kiln")
    exe.save(path)
    x = np.random.default_rng(3).standard_normal((2, 19)).astype(np.float32)
    np.testing.assert_array_equal(kiln.load(path).run({"x": x})[0], exe.run({"x": x})[0])
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    meta = json.loads(members["meta.json"])
    meta["target_key"] = meta["target_key"].replace("|", "|other-cpu-", 1)
    foreign = tmp_path / "foreign.kiln"
    with zipfile.ZipFile(foreign, "w") as z:
        for n, data in members.items():
            z.writestr(n, json.dumps(meta) if n == "meta.json" else data)
    with pytest.raises(ValueError, match="compiled for another target .*other-cpu-.*not this host"):
        kiln.load(str(foreign))


def test_load_rejects_garbage(tmp_path) -> None:  # noqa: ANN001
    p = tmp_path / "bad.kiln"
    p.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a saved Kiln executable"):
        kiln.load(str(p))


@pytest.mark.parametrize("map_weights", [False, True])
def test_load_rejects_damaged_weights(exe: kiln.Executable, tmp_path, map_weights: bool) -> None:  # noqa: ANN001
    """The weights are read straight into their aligned buffer, or mapped, still under their CRC: a flipped byte is an
    error."""
    import zipfile
    path = tmp_path / "m.kiln"
    exe.save(str(path))
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("weights.bin")
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.file_size // 2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="CRC"):
        kiln.Executable.load(str(path), map_weights=map_weights)


def test_weights_are_page_aligned_in_the_file_and_mapped(tmp_path) -> None:  # noqa: ANN001
    """The compile cache maps an entry's weights from the file (no copy into fresh memory): the member starts on a
    page, the mapping is what the kernels read, and the outputs are the same as from a read copy."""
    import mmap
    import zipfile
    model = small_model()
    exe = kiln.compile(model, num_threads=2, cache=False)
    path = tmp_path / "m.kiln"
    exe.save(str(path))
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("weights.bin")
    assert (info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)) % 4096 == 0
    mapped, read = (kiln.Executable.load(str(path), map_weights=m) for m in (True, False))
    def is_mapped(e: kiln.Executable) -> bool:  # np.frombuffer keeps a memoryview of the mapping as the base
        return isinstance(getattr(e._weights.base, "obj", None), mmap.mmap)
    assert is_mapped(mapped) and not is_mapped(read)
    x = np.random.default_rng(3).standard_normal((2, 19)).astype(np.float32)
    np.testing.assert_array_equal(mapped.run({"x": x})[0], read.run({"x": x})[0])
    np.testing.assert_array_equal(mapped.run({"x": x})[0], exe.run({"x": x})[0])


def test_saving_over_a_mapped_file_leaves_its_executable_intact(tmp_path) -> None:  # noqa: ANN001
    """save() renames a new file over the old one instead of truncating it: an executable whose weights are mapped
    from the old file (it would die of SIGBUS on a truncated one) keeps computing with its own weights."""
    path = str(tmp_path / "m.kiln")
    kiln.compile(small_model(), num_threads=2, cache=False).save(path)
    first = kiln.Executable.load(path, map_weights=True)
    other = small_model()
    other.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full(19, 5.0, np.float32), "w"))
    kiln.compile(other, num_threads=2, cache=False).save(path)
    x = np.random.default_rng(4).standard_normal((2, 19)).astype(np.float32)
    np.testing.assert_allclose(first.run({"x": x})[0], np.maximum(x + np.linspace(-1, 1, 19, dtype=np.float32), 0),
                               rtol=1e-6)
    np.testing.assert_allclose(kiln.load(path).run({"x": x})[0], np.maximum(x + 5.0, 0), rtol=1e-6)
    assert [f for f in os.listdir(tmp_path) if f != "m.kiln"] == []  # no temporary file left behind


def _weighted(values: dict[str, np.ndarray]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])
    nodes = [helper.make_node("MatMul", ["x", "big"], ["t"]), helper.make_node("Add", ["t", "small"], ["y"])]
    inits = [numpy_helper.from_array(v, k) for k, v in values.items()]
    return helper.make_model(helper.make_graph(nodes, "w", [x], [y], inits), ir_version=8)


def test_model_identity_tells_weights_apart() -> None:
    """The cache key hashes large initializers (≥ HASHED_TENSOR_BYTES, their raw bytes) and keeps small ones whole:
    one changed element in either makes another identity; equal models, the same one."""
    from kiln.compiler import HASHED_TENSOR_BYTES, model_identity
    rng = np.random.default_rng(0)
    big = rng.standard_normal((64, 512), dtype=np.float32)  # 128 KiB
    small = rng.standard_normal(512, dtype=np.float32)
    assert big.nbytes >= HASHED_TENSOR_BYTES > small.nbytes
    base = model_identity(_weighted({"big": big, "small": small}))
    assert model_identity(_weighted({"big": big.copy(), "small": small.copy()})) == base
    assert len(base) < big.nbytes  # the large tensor entered as its digest
    for name in ("big", "small"):
        changed = {"big": big.copy(), "small": small.copy()}
        changed[name].flat[7] += 1.0
        assert model_identity(_weighted(changed)) != base, name


def test_compile_cache_hit_is_fast_and_equal(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    from kiln import zoo
    model = zoo.build("resnet18")
    t = time.perf_counter()
    a = kiln.compile(model, num_threads=2)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    b = kiln.compile(model, num_threads=2)
    warm = time.perf_counter() - t
    finish_cache_writes()
    assert len(os.listdir(tmp_path)) == 1
    feeds = zoo.inputs("resnet18")
    np.testing.assert_array_equal(a.run(feeds)[0], b.run(feeds)[0])
    assert warm < cold  # the second compile loads the cached object instead of running LLVM
    c = kiln.compile(model, num_threads=2, fusion=False)  # other options: another cache entry
    finish_cache_writes()
    assert len(os.listdir(tmp_path)) == 2
    np.testing.assert_allclose(c.run(feeds)[0], a.run(feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_thread_counts_agree(threads: int) -> None:
    from kiln import zoo
    model, feeds = zoo.build("conv_r50_3x3"), zoo.inputs("conv_r50_3x3")
    ref = kiln.compile(model, num_threads=1, cache=False).run(feeds)[0]
    out = kiln.compile(model, num_threads=threads, cache=False).run(feeds)[0]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_unknown_option_is_rejected() -> None:
    with pytest.raises(TypeError, match="unknown compile option"):
        kiln.compile(small_model(), cache=False, make_it_fast=True)


# -- bad models: a clear error at compile time ------------------------------------------------------------------
def test_unsupported_op_names_op_node_and_opset() -> None:
    with pytest.raises(kiln.UnsupportedOperator) as e:
        kiln.compile(small_model("StringNormalizer"), cache=False)
    assert e.value.op_type == "StringNormalizer" and e.value.node_name == "act0" and e.value.opset == 17
    assert "StringNormalizer" in str(e.value) and "act0" in str(e.value) and "17" in str(e.value)


def test_unsupported_domain() -> None:
    m = small_model()
    m.graph.node[1].domain = "com.example"
    with pytest.raises(kiln.UnsupportedOperator, match="com.example"):
        kiln.compile(m, cache=False)


def test_truncated_file_is_a_model_error(tmp_path) -> None:  # noqa: ANN001
    p = tmp_path / "cut.onnx"
    p.write_bytes(small_model().SerializeToString()[:-7])
    with pytest.raises(kiln.ModelError, match="cannot parse"):
        kiln.compile(str(p), cache=False)


def test_missing_file() -> None:
    with pytest.raises(kiln.ModelError, match="no such model file"):
        kiln.compile("/nonexistent/model.onnx", cache=False)


def test_missing_initializer_is_a_model_error() -> None:
    m = small_model()
    del m.graph.initializer[:]
    with pytest.raises(kiln.ModelError, match="reads 'w'"):
        kiln.compile(m, cache=False)


def test_nodes_out_of_order_are_a_model_error() -> None:
    m = small_model()
    nodes = list(m.graph.node)[::-1]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    with pytest.raises(kiln.ModelError, match="topological"):
        kiln.compile(m, cache=False)


def test_opset_out_of_range() -> None:
    with pytest.raises(kiln.UnsupportedOperator, match="opset"):
        kiln.compile(small_model(opset=5), cache=False)


def test_shape_mismatch_is_a_model_error() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((4, 5), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g", [x], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(kiln.ModelError, match="MatMul inner dimensions"):
        kiln.compile(m, cache=False)


def test_symbolic_input_imports_as_a_symbol_and_pinned_compiles() -> None:
    from kiln.frontend.onnx import import_onnx
    from kiln.graph import symbolic

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 19])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 19])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert import_onnx(m).inputs[0].shape == (symbolic.symbol("batch"), 19)  # no longer refused at import
    exe = kiln.compile(m, cache=False, input_shapes={"x": (3, 19)})
    x = np.random.default_rng(3).standard_normal((3, 19)).astype(np.float32)
    np.testing.assert_array_equal(exe.run({"x": x})[0], np.maximum(x, 0))


def test_output_that_is_an_input_or_view_is_copied() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("same", "flat", "same2")]
    shape = numpy_helper.from_array(np.array([3, 4], np.int64), "shape")
    nodes = [helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Reshape", ["x", "shape"], ["flat"]),
             helper.make_node("Identity", ["x"], ["same2"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], outs, [shape]),
                          opset_imports=[helper.make_opsetid("", 17)])
    xv = np.arange(12, dtype=np.float32).reshape(2, 6)
    a, b, c = kiln.compile(m, cache=False).run({"x": xv})
    np.testing.assert_array_equal(a, xv)
    np.testing.assert_array_equal(b, xv.reshape(3, 4))
    np.testing.assert_array_equal(c, xv)


def test_atomic_path_renames_when_complete_and_leaves_the_old_file_on_error(tmp_path) -> None:  # noqa: ANN001
    """kiln.cachedir.atomic_path (Executable.save, the pool's and the strategy cache's entries, the corpus, the QEMU
    plugin): the new file replaces the old only when its writer finished; a writer that raises leaves the old file
    as it was and no temporary file behind."""
    from kiln.cachedir import atomic_path
    target = tmp_path / "entry.bin"
    target.write_bytes(b"old")
    with atomic_path(str(target)) as tmp, open(tmp, "wb") as f:
        f.write(b"new")
        assert target.read_bytes() == b"old"  # not yet renamed while the writer runs
    assert target.read_bytes() == b"new"
    with pytest.raises(RuntimeError), atomic_path(str(target)) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"half")
        raise RuntimeError("the writer failed")
    assert target.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["entry.bin"]
