"""A compile leaves little for the cycle collector: its expression rewrites build no reference cycles (a nested
function calling itself is one, and kept its memo — every expression it built — alive until the collector ran:
156k objects per resnet18 compile), and the collector is paused for the whole compile and restored after."""
from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest

import kiln
from kiln.kernel.analysis import _strip_loads, simplify_panels
from kiln.kernel.build import _replace_loads, rename_loads
from kiln.kernel.ir import Bin, Const, Expr, Load, Select, Var, atoms, maximum, rewrite, substitute, walk
from kiln.kernel.simplify import drop_satisfied_clamps
from kiln.zoo import build, inputs


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _tree(i: Var, j: Var) -> Expr:
    """A shared-subtree expression over two loop variables: loads, a panel index, a clamp, a select."""
    idx = Bin("+", Bin("*", i, Const(16, "int64")), j)
    a = Load("a", (Bin("//", idx, Const(16, "int64")), Bin("%", idx, Const(16, "int64"))), "float32")
    b = Load("b", (i, j), "float32")
    s = maximum(Bin("*", a, b), Const(0.0, "float32"))
    return Select(Bin("<", i, j), Bin("+", s, maximum(s, Const(-1.0, "float32"))), a)


def test_rewrites_leave_no_reference_cycles(collector_off: None) -> None:
    i, j, k = Var("i"), Var("j"), Var("k")
    e = _tree(i, j)
    got = [
        substitute(e, {i: Bin("+", k, Const(1, "int64"))}),
        substitute(e, {Const(16, "int64"): Const(8, "int64")}),  # a key without atoms: every subtree visited
        rename_loads(e, {"a": "x", "b": "y"}),
        _replace_loads(e, "b", lambda ld: Load("c", ld.index, ld.dtype)),
        _strip_loads(e),
        simplify_panels(e, j, 16),
        drop_satisfied_clamps(e),
        rewrite(e, pre=lambda x: Const(2, "int64") if x == j else None),
        atoms(e),
    ]
    assert gc.collect() == 0, "an expression rewrite left objects in reference cycles"
    # and they computed what they say
    assert atoms(got[0]) == {k} | {j}
    assert "x[" in repr(got[2]) and "y[" in repr(got[2]) and "a[" not in repr(got[2])
    assert "c[" in repr(got[3]) and "b[" not in repr(got[3])
    assert not any(isinstance(x, Load) for x in walk(got[4]))
    assert "//" not in repr(got[5]) and "%" not in repr(got[5])  # (i·16 + j) // 16 → i, % 16 → j
    assert got[7] == substitute(e, {j: Const(2, "int64")}) and j not in atoms(got[7])


@pytest.mark.parametrize("enabled", [True, False])
def test_compile_restores_the_collector(enabled: bool, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    (gc.enable if enabled else gc.disable)()
    try:
        exe = kiln.compile(build("mlp"))
        assert gc.isenabled() == enabled
    finally:
        gc.enable()
    feeds = inputs("mlp")
    want = ort.InferenceSession(build("mlp").SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(exe.run(feeds)[0], want[0], rtol=1e-4, atol=1e-5)
