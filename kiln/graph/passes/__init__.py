"""The graph pass pipeline: each pass a function Graph → Graph in its own file, listed once here
with the option that switches it (`kiln.compile(..., fold_batchnorm=False)`, `kiln bench --ablate`)."""
from __future__ import annotations

import inspect
import os
from collections.abc import Callable

from kiln.graph.ir import Graph
from kiln.graph.passes.block_layout import block_layout
from kiln.graph.passes.conv1d_as_2d import conv1d_as_2d
from kiln.graph.passes.elementwise_through_views import elementwise_through_views
from kiln.graph.passes.eliminate_dead_code import eliminate_dead_code
from kiln.graph.passes.fold_batchnorm import fold_batchnorm
from kiln.graph.passes.fold_constants import fold_constants
from kiln.graph.passes.fold_pad import fold_pad
from kiln.graph.passes.materialize_outputs import materialize_outputs
from kiln.graph.passes.pack_weights import pack_weights
from kiln.graph.passes.pad_pair_channels import pad_pair_channels
from kiln.graph.passes.precision import lower_precision
from kiln.graph.passes.quantize_qdq import quantize_qdq
from kiln.graph.passes.recognize_gelu import recognize_gelu
from kiln.graph.passes.scale_after_matmul import scale_after_matmul
from kiln.graph.passes.winograd import winograd_conv
from kiln.graph.symbolic import using_bounds
from kiln.target import Target

Pass = Callable[..., Graph]  # Graph → Graph, optionally also given the Target and the options (by parameter name)

# (option name, pass); options that are off skip their pass. materialize_outputs is required.
GRAPH_PASSES: list[tuple[str, Pass]] = [
    ("quantize_qdq", quantize_qdq),  # first: it needs the integer weights that fold_constants would dequantize
    ("fold_constants", fold_constants),
    ("eliminate_dead_code", eliminate_dead_code),
    ("recognize_gelu", recognize_gelu),
    ("scale_after_matmul", scale_after_matmul),
    ("fold_pad", fold_pad),
    ("fold_batchnorm", fold_batchnorm),
    ("eliminate_dead_code", eliminate_dead_code),
    ("elementwise_through_views", elementwise_through_views),
    ("eliminate_dead_code", eliminate_dead_code),  # the views it bypassed
    ("conv1d_as_2d", conv1d_as_2d),
    ("pad_pair_channels", pad_pair_channels),  # bf16 RGB stems: a 4-channel block for vdpbf16ps
    ("block_layout", block_layout),
    ("winograd", winograd_conv),
    ("pack_weights", pack_weights),
    ("lower_precision", lower_precision),
    ("", materialize_outputs),
]


VERIFY_EACH_ENV = "KILN_VERIFY_EACH_PASS"


def run_graph_passes(g: Graph, options: dict[str, bool], target: Target,
                     trace: Callable[[str, Graph], None] | None = None, verify: bool = True) -> Graph:
    """The passes in order. `verify`: the graph is checked (Graph.verify: topological order, every node's types
    re-inferred) after the last pass — and after every pass with $KILN_VERIFY_EACH_PASS=1 (the test suite sets it,
    as LLVM's -verify-each), which names the pass that broke it: the check is most of the passes' time (gpt_decoder
    with symbolic dims: 22 of 27 ms)."""
    each = verify and os.environ.get(VERIFY_EACH_ENV, "") not in ("", "0")
    ran = ""
    for opt, p in GRAPH_PASSES:
        if opt and not options.get(opt, True):
            continue
        with using_bounds(g.bounds):  # symbolic dims: the graph's bounds decide comparisons in the pass
            params = inspect.signature(p).parameters
            g = p(g, **{k: v for k, v in (("target", target), ("options", options)) if k in params})
        ran = p.__name__
        if each:
            _verify_after(g, ran)
        if trace:
            trace(p.__name__, g)
    if verify and not each:
        _verify_after(g, f"the graph passes (the last: {ran}; ${VERIFY_EACH_ENV}=1 checks after each)")
    return g


def _verify_after(g: Graph, what: str) -> None:
    from kiln.errors import ModelError
    try:
        g.verify()
    except ModelError as e:
        raise ModelError(f"after {what}: {e}") from e
