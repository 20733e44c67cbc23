"""Ahead of time: kiln.from_torch(module, example_inputs) through torch.export gives an Executable that runs
without torch, saves and loads like any other; what it cannot take is an error naming the op and its source line.
Outputs are compared with eager PyTorch: max|kiln − eager| ≤ 1e-4 · max(max|eager|, 1e-6)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch_cases import _fresh_dynamo, assert_matches, case, emit_module  # noqa: E402, F401

import kiln  # noqa: E402
import kiln.torch  # noqa: E402
from conftest import width_runs  # noqa: E402
from kiln.target import resolve  # noqa: E402


def test_from_torch_saves_and_loads(tmp_path: pytest.TempPathFactory) -> None:
    module, inputs = case("transformer_sdpa_causal")
    with torch.no_grad():
        want = module(*inputs)
    exe = kiln.from_torch(module, inputs, num_threads=2, cache=False)
    assert [s.name for s in exe.inputs] == ["x"] and [s.name for s in exe.outputs] == ["output_0", "output_1"]
    feeds = {"x": inputs[0].numpy()}
    got = [torch.from_numpy(o) for o in exe.run(feeds)]
    assert_matches(got, list(want))
    path = str(tmp_path / "block.kiln")
    exe.save(path)
    loaded = kiln.load(path)
    assert_matches([torch.from_numpy(o) for o in loaded.run(feeds)], list(want), what="loaded")
    assert_matches(list(kiln.torch.as_module(loaded)(*inputs)), list(want), what="loaded, on tensors")


@pytest.mark.parametrize("name", ["convnet_bn", "transformer_sdpa_causal"])
def test_from_torch_matches_eager_per_width(name: str, width: str) -> None:
    """The AOT path per x86 vector width: the exported program compiled for `width`, run (or, on a host that cannot
    execute it, lowered and emitted), compared with eager PyTorch."""
    module, inputs = case(name)
    if not width_runs(width):
        emit_module(module, inputs, width)
        return
    with torch.no_grad():
        want = module(*inputs)
    exe = kiln.from_torch(module, inputs, target=width, num_threads=2, cache=False)
    assert exe.target.vector_bits == resolve(width).vector_bits
    got = kiln.torch.as_module(exe)(*inputs)
    if isinstance(want, tuple):
        assert_matches(list(got), list(want))
    else:
        assert_matches(got[0] if isinstance(got, (tuple, list)) else got, want)


def test_from_torch_dynamic_shapes_compile_once(tmp_path: pytest.TempPathFactory) -> None:
    """torch.export's `dynamic_shapes`: batch and sequence become Kiln's symbolic dims, named and bounded as the
    Dims (1..4, 1..32: the declared minimum, not the 2 torch's shape environment starts at); one compile runs every
    size within them — the causal mask's size included — and matches eager PyTorch; a size outside is a ValueError
    naming the dim and its bounds before anything runs; the saved executable stays dynamic."""
    module, inputs = case("transformer_sdpa_causal")
    batch, seq = torch.export.Dim("batch", min=1, max=4), torch.export.Dim("seq", min=1, max=32)
    exe = kiln.from_torch(module, inputs, dynamic_shapes=({0: batch, 1: seq},), num_threads=2, cache=False)
    assert exe.meta["compilations"] == 1
    assert exe.meta["dynamic"]["bounds"] == {"batch": [1, 4], "seq": [1, 32]}, exe.meta["dynamic"]  # the Dims' names
    path = str(tmp_path / "dyn.kiln")
    exe.save(path)
    loaded = kiln.load(path)
    for i, (b, n) in enumerate([(1, 1), (2, 10), (4, 32), (3, 17), (1, 5)]):
        x = torch.randn(b, n, 32, generator=torch.Generator().manual_seed(i))
        with torch.no_grad():
            want = module(x)
        run = loaded if i == 4 else exe
        got = [torch.from_numpy(o) for o in run.run({"x": x.numpy()})]
        assert_matches(got, list(want), what=f"batch {b}, seq {n}")
    with pytest.raises(ValueError, match=r"'seq' = 33 .* outside the bounds \[1, 32\]"):
        exe.run({"x": torch.randn(1, 33, 32).numpy()})


def test_from_torch_dynamic_shapes_by_argument_name() -> None:
    """`dynamic_shapes` as a dict by the forward's argument names; a Dim named like Kiln's own symbols (`sym0`) keeps
    its name and does not collide with them. Every size in the range matches eager PyTorch."""
    module, inputs = case("mlp_activations")
    exe = kiln.from_torch(module, inputs, dynamic_shapes={"x": {0: torch.export.Dim("sym0", min=1, max=16)}},
                          num_threads=2, cache=False)
    assert exe.meta["dynamic"]["bounds"] == {"sym0": [1, 16]}, exe.meta["dynamic"]
    for rows in (1, 5, 16):
        x = torch.randn(rows, inputs[0].shape[1], generator=torch.Generator().manual_seed(rows))
        with torch.no_grad():
            want = module(x)
        assert_matches([torch.from_numpy(o) for o in exe.run({"x": x.numpy()})], list(want), what=f"{rows} rows")


def test_from_torch_several_inputs_and_int_indices() -> None:
    module, inputs = case("embeddings_gather")
    exe = kiln.from_torch(module, inputs, cache=False)
    assert [(s.name, s.dtype) for s in exe.inputs] == [("ids", "int64"), ("x", "float32")]
    with torch.no_grad():
        assert_matches(list(kiln.torch.as_module(exe)(*inputs)), list(module(*inputs)))


class Sorts(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(x, dim=-1).values * 2


def test_from_torch_names_what_it_cannot_compile() -> None:
    with pytest.raises(kiln.UnsupportedOperator) as info:
        kiln.from_torch(Sorts(), (torch.randn(3, 4),), cache=False)
    msg = str(info.value)
    assert info.value.op_type == "aten.sort.default" and "no Kiln importer" in msg, msg
    assert "test_torch_export.py:" in msg and "torch.sort(x, dim=-1)" in msg, msg


class Counts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x * self.calls


def test_from_torch_refuses_a_module_that_writes_its_buffers() -> None:
    with pytest.raises(kiln.UnsupportedOperator, match=r"it writes to \['calls'\] when it runs"):
        kiln.from_torch(Counts(), (torch.randn(3),), cache=False)


def test_from_torch_refuses_non_tensors_and_other_devices() -> None:
    with pytest.raises(TypeError, match="example input 0 is a list"):
        kiln.from_torch(Sorts(), ([1.0, 2.0],))
    with pytest.raises(ValueError, match="example input 0 is on meta"):
        kiln.from_torch(Sorts(), (torch.randn(2, device="meta"),))
