"""MethodConfig / FoldConfig: every refused combination and value with its one-line message, enum coercion, the
record parameters and labels that eval records on disk were written with (the old ``eval.harness.MethodSpec``'s,
written out below), and ``specfold.generate`` taking a MethodConfig exactly as it takes loose keywords."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specfold.api import generate, load_model
from specfold.config import (
    AttentionMode,
    Backend,
    FfnReuse,
    FoldConfig,
    MethodConfig,
    MethodName,
)
from specfold.decoding.draft_graph import DraftGraph
from specfold.eval.harness import record_key
from specfold.validation import ValidationError

pytestmark = pytest.mark.usefixtures("one_thread")

# MethodConfig options -> (label, params) exactly as MethodSpec produced them for the same options (MethodSpec was
# given delta=0.1 wherever specfold's δ was left at its default: every command and sweep passed it explicitly).
RECORDED = [
    ({"method": "vanilla"}, "vanilla", {}),
    ({"method": "spiffy"}, "spiffy", {"budget": None, "depth": None, "graph": None}),
    ({"method": "spiffy", "budget": 3}, "spiffy[budget=3]", {"budget": 3, "depth": None, "graph": None}),
    ({"method": "spiffy", "budget": 7, "depth": 2}, "spiffy[budget=7,depth=2]",
     {"budget": 7, "depth": 2, "graph": None}),
    ({"method": "spiffy", "graph": "g.json", "lookahead": False}, "spiffy[lookahead=False]",
     {"budget": None, "depth": None, "graph": "g.json", "lookahead": False}),
    ({"method": "specfold"}, "specfold[delta=0.1]",
     {"budget": None, "depth": None, "graph": None, "delta": 0.1, "backend": "torch", "ffn": "residual",
      "attention": "auto"}),
    ({"method": "specfold", "budget": 3, "delta": 0.0}, "specfold[budget=3,delta=0.0]",
     {"budget": 3, "depth": None, "graph": None, "delta": 0.0, "backend": "torch", "ffn": "residual",
      "attention": "auto"}),
    ({"method": "specfold", "budget": 4, "delta": 0.2, "backend": "torch", "ffn": "residual", "attention": "auto"},
     "specfold[budget=4,delta=0.2]",
     {"budget": 4, "depth": None, "graph": None, "delta": 0.2, "backend": "torch", "ffn": "residual",
      "attention": "auto"}),
    ({"method": "specfold", "delta": 0.05, "attention": "direct"}, "specfold[delta=0.05,attention=direct]",
     {"budget": None, "depth": None, "graph": None, "delta": 0.05, "backend": "torch", "ffn": "residual",
      "attention": "direct"}),
    ({"method": "specfold", "budget": 7, "depth": 2, "delta": 0.3, "graph": "g.json", "backend": "triton",
      "ffn": "paper", "attention": "correct", "lookahead": True},
     "specfold[budget=7,depth=2,lookahead=True,delta=0.3,backend=triton,ffn=paper,attention=correct]",
     {"budget": 7, "depth": 2, "graph": "g.json", "lookahead": True, "delta": 0.3, "backend": "triton",
      "ffn": "paper", "attention": "correct"}),
]


@pytest.mark.parametrize(("options", "label", "params"), RECORDED, ids=[r[1] for r in RECORDED])
def test_label_and_params_are_the_recorded_ones(options, label, params):
    cfg = MethodConfig(**options)
    assert cfg.label == label
    assert json.dumps(cfg.params) == json.dumps(params)  # same keys, order, values and JSON types


def test_record_key_of_a_recorded_method_is_unchanged():
    cfg = MethodConfig("specfold", budget=3, delta=0.0)
    rec = {"task": "synth-math", "method": cfg.method, "params": cfg.params, "sample_id": "s1"}
    assert record_key(rec) == (
        '["synth-math", "specfold", {"attention": "auto", "backend": "torch", "budget": 3, "delta": 0.0, '
        '"depth": null, "ffn": "residual", "graph": null}, "s1"]'
    )


REFUSED = [
    ({"method": "beam"}, "unknown method 'beam'; choose one of vanilla, spiffy, specfold"),
    ({"delta": 0.5}, "delta applies to specfold, not vanilla"),
    ({"backend": "triton"}, "backend applies to specfold, not vanilla"),
    ({"ffn": "paper"}, "ffn applies to specfold, not vanilla"),
    ({"attention": "direct"}, "attention applies to specfold, not vanilla"),
    ({"graph": "g.json"}, "graph applies to spiffy or specfold, not vanilla"),
    ({"budget": 3}, "budget applies to spiffy or specfold, not vanilla"),
    ({"depth": 2}, "depth applies to spiffy or specfold, not vanilla"),
    ({"lookahead": False}, "lookahead applies to spiffy or specfold, not vanilla"),
    ({"method": "spiffy", "delta": 0.5}, "delta applies to specfold, not spiffy"),
    ({"method": "spiffy", "backend": "torch"}, "backend applies to specfold, not spiffy"),
    ({"method": "spiffy", "ffn": "residual"}, "ffn applies to specfold, not spiffy"),
    ({"method": "spiffy", "attention": "auto"}, "attention applies to specfold, not spiffy"),
    ({"method": "specfold", "delta": 1.5}, "delta must be a finite number in [0, 1], got 1.5"),
    ({"method": "specfold", "delta": -0.1}, "delta must be a finite number in [0, 1], got -0.1"),
    ({"method": "specfold", "delta": float("nan")}, "delta must be a finite number in [0, 1], got nan"),
    ({"method": "specfold", "delta": "x"}, "delta must be a finite number in [0, 1], got 'x'"),
    ({"method": "specfold", "delta": True}, "delta must be a finite number in [0, 1], got True"),
    ({"method": "specfold", "backend": "cuda"}, "unknown backend 'cuda'; choose one of torch, triton"),
    ({"method": "specfold", "ffn": "x"}, "unknown ffn 'x'; choose one of residual, paper"),
    ({"method": "specfold", "attention": "x"}, "unknown attention 'x'; choose one of auto, correct, direct"),
    ({"method": "spiffy", "budget": 0}, "budget must be positive, got 0"),
    ({"method": "spiffy", "budget": 2.5}, "budget must be positive, got 2.5"),
    ({"method": "spiffy", "budget": True}, "budget must be positive, got True"),
    ({"method": "spiffy", "depth": -1}, "depth cap must be positive, got -1"),
    ({"method": "spiffy", "lookahead": "no"}, "lookahead must be True, False or None, got 'no'"),
    ({"method": "spiffy", "graph": 3}, "graph must be a file path or a DraftGraph, got int"),
]


@pytest.mark.parametrize(("options", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_refused_with_one_line(options, message):
    with pytest.raises(ValidationError) as info:
        MethodConfig(**options)
    assert str(info.value) == message


def test_strings_become_enums_and_the_fold_fills_defaults():
    cfg = MethodConfig("specfold", backend="triton", attention="correct", graph=Path("g.json"), delta=0)
    assert cfg.method is MethodName.SPECFOLD and cfg.backend is Backend.TRITON
    assert cfg.attention is AttentionMode.CORRECT and cfg.ffn is None and cfg.graph == "g.json"
    assert isinstance(cfg.delta, float) and cfg.delta == 0.0
    assert cfg.fold == FoldConfig(0.0, Backend.TRITON, FfnReuse.RESIDUAL, AttentionMode.CORRECT)
    assert MethodConfig("specfold").fold == FoldConfig() == FoldConfig(0.1, "torch", "residual", "auto")
    assert MethodConfig("spiffy").fold == FoldConfig()  # a method without folding: the defaults
    with pytest.raises(ValidationError, match="delta must be a finite number"):
        FoldConfig(delta=2.0)
    with pytest.raises(ValidationError, match="unknown ffn 'x'"):
        FoldConfig(ffn="x")


def test_frozen_hashable_and_for_another_method():
    graph = DraftGraph.from_strings(["(1,1)", "(2,1)"])
    cfg = MethodConfig("specfold", graph=graph, delta=0.2, backend="torch", lookahead=False)
    assert {cfg: 1}[MethodConfig("specfold", graph=graph, delta=0.2, backend="torch", lookahead=False)] == 1
    with pytest.raises(AttributeError):
        cfg.delta = 0.3  # type: ignore[misc]
    assert cfg.for_method("spiffy") == MethodConfig("spiffy", graph=graph, lookahead=False)
    assert cfg.for_method("vanilla") == MethodConfig()
    assert cfg.params["graph"] == "DraftGraph[(1,1);(2,1)]"  # a graph object is named by its nodes in records


# ------------------------------------------------------------------------------------------------------ generate


@pytest.fixture(scope="module")
def embedded():
    return load_model(None)  # fp32


PROMPTS = ["What is 3 + 4?", "Write a function add(a, b) that returns a + b."]
LOOSE = [
    {"method": "vanilla"},
    {"method": "spiffy", "budget": 3},
    {"method": "specfold", "delta": 0.0, "attention": "correct"},
    {"method": "specfold", "delta": 0.1},
]


@pytest.mark.parametrize("options", LOOSE, ids=lambda o: MethodConfig(**o).label)
def test_generate_with_a_method_config_is_generate_with_keywords(embedded, options):
    decode = {"max_new_tokens": 24}
    for prompt in PROMPTS:
        loose = generate(embedded, prompt, **decode, **options)
        typed = generate(embedded, prompt, method=MethodConfig(**options), **decode)
        assert typed.token_ids == loose.token_ids and typed.nfe == loose.nfe
    several = generate(embedded, PROMPTS, method=MethodConfig(**options), **decode)
    assert [r.token_ids for r in several] == [r.token_ids for r in generate(embedded, PROMPTS, **decode, **options)]


def test_generate_refuses_keywords_beside_a_method_config(embedded):
    with pytest.raises(ValidationError, match="delta: give the method's options in its MethodConfig"):
        generate(embedded, "hi", method=MethodConfig("specfold"), delta=0.2, max_new_tokens=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'detla'"):
        generate(embedded, "hi", method="specfold", detla=0.2, max_new_tokens=4)
    with pytest.raises(ValidationError, match="delta applies to specfold, not spiffy"):
        generate(embedded, "hi", method="spiffy", delta=0.2, max_new_tokens=4)
