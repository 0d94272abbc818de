"""Which MethodConfig a request decodes with: the server's options (``specfold serve`` flags) that apply to the
method it names, its δ or the server's; refusals name the field. In process: the engine is built, not started."""

from __future__ import annotations

import pytest

from specfold.api import load_model
from specfold.config import MethodConfig, MethodName
from specfold.serve import ServerConfig, engine_settings
from specfold.serve.engine import ServeEngine
from specfold.validation import ValidationError


@pytest.fixture(scope="module")
def model():
    return load_model(None)


def engine(model, method: str, **options) -> ServeEngine:
    config = ServerConfig(method=MethodName(method), options=MethodConfig("specfold", **options), max_batch=1)
    return ServeEngine(model, engine_settings(model, config))


def test_a_vanilla_server_keeps_its_delta_and_backend_for_specfold_requests(model):
    e = engine(model, "vanilla", delta=0.2, attention="correct")  # as `specfold serve --delta 0.2 --attention ...`
    graph = e.settings.options.graph
    assert graph is not None and graph.budget == 7  # the shipped graph, resolved once
    assert e.method_for() == e.default == MethodConfig()
    assert e.method_for("specfold") == MethodConfig("specfold", graph=graph, delta=0.2, attention="correct")
    assert e.method_for("specfold", 0.3).fold.delta == 0.3
    assert e.method_for("spiffy") == MethodConfig("spiffy", graph=graph)
    with pytest.raises(ValidationError, match="^delta applies to specfold, not vanilla$"):
        e.method_for(None, 0.1)
    with pytest.raises(ValidationError, match="^unknown method 'beam'; choose one of vanilla, spiffy, specfold$"):
        e.method_for("beam")


def test_a_specfold_server_defaults_to_its_delta_and_a_budget_selects_the_graph(model):
    e = engine(model, "specfold", budget=3)
    assert e.default.method is MethodName.SPECFOLD and e.default.delta == 0.1 and e.default.graph.budget == 3
    assert e.method_for(None, 0.0) == MethodConfig("specfold", graph=e.default.graph, delta=0.0)


def test_without_a_draft_graph_only_vanilla_is_served(model, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(model.path, bare, ignore=shutil.ignore_patterns("draft_graph*"))
    plain = load_model(str(bare))
    e = ServeEngine(plain, engine_settings(plain, ServerConfig(max_batch=1)))
    assert e.settings.options.graph is None
    with pytest.raises(ValueError, match="method spiffy needs a draft graph and this model has none"):
        e.check_method(e.method_for("spiffy"))
    with pytest.raises(ValueError, match="no draft graph"):
        engine_settings(plain, ServerConfig(method=MethodName.SPECFOLD, max_batch=1))
