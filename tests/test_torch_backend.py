"""The "kiln" torch.compile backend: fallback of unsupported ops to eager PyTorch (and the fullgraph error),
per-shape recompiles through the compile cache, options, the entry point, frozen parameters that change, and the
zero-copy I/O path with its checks. Outputs are compared with eager PyTorch (tests/torch_cases.py: 1e-4 of
max|eager|)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch_cases import _fresh_dynamo, assert_matches, check_module  # noqa: E402, F401

import kiln  # noqa: E402
import kiln.torch  # noqa: E402


class WithCumprod(nn.Module):
    """A conv, then cumprod (no Kiln importer), then a linear layer: two Kiln partitions around one eager op."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x)).mean(2) * 0.5
        y = torch.cumprod(y, dim=-1)
        return torch.sigmoid(self.fc(y))


def test_unsupported_op_runs_eagerly_with_the_rest_in_kiln(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="kiln.torch"):
        check_module(WithCumprod(), [torch.randn(2, 3, 6, 5)], fullgraph=False)
    lines = [r.getMessage() for r in caplog.records if "left to eager PyTorch" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    assert "aten.cumprod.default ×1 (no Kiln importer for this op)" in lines[0]
    assert "test_torch_backend.py" in lines[0] and "torch.cumprod(y, dim=-1)" in lines[0], lines[0]
    st = kiln.torch.stats()
    assert st["fallback_ops"] == 1 and st["compiles"] == 2, st  # conv…mean before, linear…sigmoid after


def test_fullgraph_with_an_unsupported_op_is_an_error_naming_it() -> None:
    torch.manual_seed(0)
    m = WithCumprod().eval()
    compiled = torch.compile(m, backend="kiln", fullgraph=True, options={"cache": False})
    with pytest.raises(Exception) as info, torch.no_grad():
        compiled(torch.randn(2, 3, 6, 5))
    msg = str(info.value)
    assert "aten.cumprod.default" in msg and "fullgraph=True" in msg, msg
    assert "test_torch_backend.py:" in msg and "torch.cumprod(y, dim=-1)" in msg, msg  # the source line


class Float64Tail(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.tanh(self.fc(x)).double() * 3).sum(-1)


def test_a_dtype_kiln_does_not_compute_falls_back_saying_so(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="kiln.torch"):
        check_module(Float64Tail(), [torch.randn(3, 6)], fullgraph=False)
    assert "dtype float64: Kiln computes float32" in caplog.text, caplog.text
    assert kiln.torch.stats()["compiles"] == 1


def test_dynamic_shapes_compile_once_with_symbolic_dims(caplog: pytest.LogCaptureFixture,
                                                         tmp_path: pytest.TempPathFactory,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """dynamic=True: torch's shape symbols become Kiln's symbolic dims — one compile serves every size within the
    bounds (`dynamic_max` caps them); a size beyond them is specialized through the compile cache, saying so."""
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4), nn.Softmax(-1)).eval()
    compiled = torch.compile(m, backend="kiln", dynamic=True, options={"threads": 2, "dynamic_max": 64})
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln.torch"):
        for rows in (3, 5, 64, 9, 3, 5):
            x = torch.randn(rows, 8)
            assert_matches(compiled(x), m(x), what=f"{rows} rows")
        st = kiln.torch.stats()
        assert st["symbolic"] == 1 and st["specializations"] == 1 and st["compiles"] == 1, st
        assert "specialized" not in caplog.text, caplog.text
        x = torch.randn(65, 8)  # beyond dynamic_max: one static compile, named
        assert_matches(compiled(x), m(x), what="65 rows")
    st = kiln.torch.stats()
    assert st["specializations"] == 2 and st["compiles"] == 2, st
    assert "beyond the symbolic bounds {'sym0': (2, 64)}" in caplog.text, caplog.text
    torch._dynamo.reset()  # a fresh graph: the same symbolic program, served by Kiln's compile cache
    compiled = torch.compile(m, backend="kiln", dynamic=True, options={"threads": 2, "dynamic_max": 64})
    with torch.no_grad():
        x = torch.randn(7, 8)
        assert_matches(compiled(x), m(x))
    assert kiln.torch.stats()["cache_hits"] == 1


@pytest.mark.parametrize("name", ["transformer_sdpa_causal", "normalizations"])
def test_dynamic_sequence_and_batch_in_one_compile(name: str) -> None:
    """A transformer block with a causal mask built from the sequence length (arange/full over a symbolic size) and
    normalizations whose eps dynamo passes as tensors (inlined by value): every size of the marked dims from one
    Kiln compile per partition, each matching eager PyTorch."""
    from torch_cases import case

    m, (x,) = case(name)
    compiled = torch.compile(m, backend="kiln", options={"threads": 2})
    dims = (0, 1) if name.startswith("transformer") else (0,)
    sizes = [(2, 10), (3, 7), (2, 16), (4, 3)] if len(dims) == 2 else [(2,), (3,), (5,)]
    with torch.no_grad():
        for size in sizes:
            xs = torch.randn(*size, *x.shape[len(size):])
            for d in dims:
                torch._dynamo.mark_dynamic(xs, d)
            assert_matches(compiled(xs), m(xs), what=f"{name} {size}")
    st = kiln.torch.stats()
    assert st["symbolic"] == 1 and st["specializations"] == 1 and "fallback_ops" not in st, st


def test_a_graph_kiln_cannot_take_symbolically_is_specialized_per_shape(caplog: pytest.LogCaptureFixture) -> None:
    """dynamic=True makes a conv's height and width symbolic, which Kiln refuses (a window over a symbolic dim):
    the log line names the op and the dim, and each shape compiles on its own, correctly."""
    from torch_cases import case

    m, (x,) = case("convnet_bn")
    compiled = torch.compile(m, backend="kiln", dynamic=True, options={"threads": 2})
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln.torch"):
        for b in (2, 3):
            xs = torch.randn(b, *x.shape[1:])
            assert_matches(compiled(xs), m(xs), what=f"batch {b}")
    assert "not compiled with symbolic dims" in caplog.text and "PackedConv" in caplog.text, caplog.text
    st = kiln.torch.stats()
    assert "symbolic" not in st and st["specializations"] == 2, st


def test_a_changed_scalar_argument_specializes_again() -> None:
    """A Python float argument dynamo passes as a 0-d tensor is inlined by value, and a new value re-specializes
    (never a stale constant)."""
    class Scaled(nn.Module):
        def forward(self, x: torch.Tensor, alpha: float) -> torch.Tensor:
            return torch.tanh(x) * alpha + alpha

    m = Scaled()
    compiled = torch.compile(m, backend="kiln", dynamic=True, options={"threads": 2})
    x = torch.randn(4, 8)
    for alpha in (0.5, 0.5, 2.0):
        assert_matches(compiled(x, alpha), m(x, alpha), what=f"alpha {alpha}")
    st = kiln.torch.stats()
    assert st["refreezes"] == 1 and st["specializations"] == 2, st


def test_options_reach_kiln_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict] = []
    real = kiln.compile

    def spy(model: object, **kw: object) -> object:
        seen.append(kw)
        return real(model, **kw)

    monkeypatch.setattr(kiln, "compile", spy)
    torch.manual_seed(0)
    check_module(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), [torch.randn(4, 8)],
                 threads=1, strategy="ukernel", fold_constants=False)
    assert seen and seen[0]["num_threads"] == 1 and seen[0]["strategy"] == "ukernel", seen
    assert seen[0]["fold_constants"] is False


def test_an_unknown_option_is_refused_by_kiln_compile() -> None:
    compiled = torch.compile(nn.Linear(4, 4), backend="kiln", options={"bogus_option": 3})
    with pytest.raises(Exception, match=r"unknown compile option\(s\) \['bogus_option'\]"), torch.no_grad():
        compiled(torch.randn(2, 4))


def test_backend_found_through_the_entry_point_without_importing_kiln() -> None:
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="torch_dynamo_backends")}
    assert names.get("kiln") == "kiln.torch:backend", (
        f"the torch_dynamo_backends entry point is not installed ({names}): reinstall Kiln (pip install -e .)")
    code = ("import sys, torch\n"
            "m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()).eval()\n"
            "x = torch.randn(2, 4)\n"
            "assert 'kiln' not in sys.modules\n"
            "with torch.no_grad():\n"
            "    y = torch.compile(m, backend='kiln', options={'cache': False})(x)\n"
            "    assert torch.allclose(y, m(x), rtol=0, atol=1e-5), (y, m(x))\n"
            "print(sorted(k for k in sys.modules if k.startswith('kiln.torch'))[:1])\n")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(kiln.__file__))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "kiln.torch" in out.stdout


def test_changed_parameters_are_refrozen(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2)).eval()
    compiled = torch.compile(m, backend="kiln", options={"cache": False})
    x = torch.randn(3, 6)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="kiln.torch"):
        assert_matches(compiled(x), m(x))
        m[0].weight.mul_(-2)                                   # in place: the version counter moves
        assert_matches(compiled(x), m(x), what="after an in-place update")
        m.load_state_dict({k: torch.randn_like(v) for k, v in m.state_dict().items()})
        assert_matches(compiled(x), m(x), what="after load_state_dict")
    assert kiln.torch.stats()["refreezes"] == 2
    assert "parameters changed since they were frozen" in caplog.text


# -- zero-copy I/O and its checks ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def linear_exe() -> kiln.Executable:
    torch.manual_seed(0)
    return kiln.from_torch(nn.Sequential(nn.Linear(8, 5), nn.ReLU()).eval(), (torch.randn(4, 8),), cache=False)


def test_contiguous_float32_tensors_go_in_and_out_without_copies(linear_exe: kiln.Executable,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple] = []
    real = linear_exe.run_pointers
    monkeypatch.setattr(linear_exe, "run_pointers", lambda i, o: (seen.append((list(i), list(o))), real(i, o))[1])
    call = kiln.torch.as_module(linear_exe)
    x = torch.randn(4, 8)
    y = call(x)
    assert seen[0][0] == [x.data_ptr()] and seen[0][1] == [y.data_ptr()], "an input or output was copied"
    want = linear_exe.run({linear_exe.inputs[0].name: x.numpy()})[0]
    assert_matches(y, torch.from_numpy(want))
    xt = torch.randn(8, 4).t()  # same shape, transposed strides: made contiguous (one copy, counted)
    copies = kiln.torch.stats()["input_copies"]
    assert_matches(call(xt), call(xt.contiguous()))
    assert seen[-2][0] != [xt.data_ptr()] and kiln.torch.stats()["input_copies"] == copies + 1


@pytest.mark.parametrize("bad, match", [
    (lambda: torch.randn(4, 8, device="meta"), r"input 0 \('input'\) is on meta; Kiln compiled this model for this "
                                               r"machine's CPU"),
    (lambda: torch.randn(4, 8, dtype=torch.float64), r"input 0 \('input'\) is torch.float64, the model was compiled "
                                                     r"for torch.float32"),
    (lambda: torch.randn(4, 9), r"input 0 \('input'\) has shape \[4, 9\], the model was compiled for \[4, 8\]"),
])
def test_bad_inputs_are_refused_saying_what_was_expected(linear_exe: kiln.Executable, bad: object,
                                                         match: str) -> None:
    with pytest.raises(ValueError, match=match):
        kiln.torch.as_module(linear_exe)(bad())


def test_cuda_tensors_are_refused_by_the_backend() -> None:
    """A graph whose tensors live on another device stays with PyTorch (Kiln compiles for this CPU): the
    probe refuses it by device, before anything is compiled."""
    from kiln.frontend.torch import unsupported_reason

    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(2, 3, device="meta")
    y = g.call_function(torch.ops.aten.relu.default, (x,))
    y.meta["val"] = torch.empty(2, 3, device="meta")
    assert "a tensor on meta: Kiln compiles for this machine's CPU" in unsupported_reason(y)


def test_torch_shape_expressions_become_kiln_dims() -> None:
    """torch's size arithmetic (its FloorDiv, CeilDiv, Mod, Max, powers) on Kiln's renamed symbols; a size that is
    not integer arithmetic (1/s) is refused by name."""
    import sympy
    from torch.utils._sympy import functions as F

    from kiln.frontend.torch.importer import TorchSymbols
    from kiln.graph import symbolic

    s0, s1 = (sympy.Symbol(n, integer=True, positive=True) for n in ("s0", "s1"))
    syms = TorchSymbols({"s0": "sym0", "s1": "sym1"}, {"sym0": (2, 512), "sym1": (2, 512)})
    a, b = symbolic.symbol("sym0"), symbolic.symbol("sym1")
    cases = [(s0 * 8 + 1, 8 * a + 1), (F.FloorDiv(s0, 2), a // 2), (F.CeilDiv(s0, 4), (a + 3) // 4),
             (F.PythonMod(s1, 5), sympy.Mod(b, 5)), (sympy.Max(s0, s1), sympy.Max(a, b)), (s0 ** 2, a * a)]
    for torch_expr, want in cases:
        got = syms._expr(torch_expr)
        for v0, v1 in ((2, 3), (7, 11), (512, 509)):
            assert symbolic.evaluate(got, {"sym0": v0, "sym1": v1}) == symbolic.evaluate(want, {"sym0": v0, "sym1": v1})
    with pytest.raises(kiln.errors.ModelError, match="not integer arithmetic"):
        syms._expr(s0 ** -1)
    with pytest.raises(kiln.errors.ModelError, match="not a dim of the graph's inputs"):
        syms._expr(sympy.Symbol("s9", integer=True, positive=True))
