"""Formula helpers, DraftGraph construction, JSON round-trip and every validation error."""

from __future__ import annotations

import json

import pytest

from specfold.decoding.draft_graph import (
    ROOT,
    DraftGraph,
    formula_depth,
    formula_parent,
    formula_to_str,
    make_formula,
    parse_formula,
)


def test_formula_string_round_trip_and_helpers():
    f = parse_formula(" (2,1) + (1,3) | (3,1) ")
    assert f == (frozenset({(1, 3), (2, 1)}), frozenset({(3, 1)}))
    assert formula_to_str(f) == "(1,3)+(2,1)|(3,1)"
    assert parse_formula(formula_to_str(f)) == f
    assert formula_depth(f) == 2
    assert formula_parent(f) == (frozenset({(1, 3), (2, 1)}),)
    assert formula_parent(formula_parent(f)) == ROOT
    assert parse_formula("") == ROOT == parse_formula("()")
    assert formula_to_str(ROOT) == ""
    assert make_formula([[(1, 1)], [(2, 1), (3, 2)]]) == parse_formula("(1,1)|(2,1)+(3,2)")
    with pytest.raises(ValueError, match="root formula has no parent"):
        formula_parent(ROOT)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("(0,1)", "malformed pair \\(0,1\\)"),
        ("(1,-2)", "malformed pair \\(1,-2\\)"),
        ("(a,1)", "malformed pair '\\(a,1\\)'"),
        ("(1,1)+", "malformed pair ''"),
        ("(1,1)|(1,2)", "position rank 1 appears more than once"),
        ("(1,1)+(1,2)", "position rank 1 appears more than once"),
    ],
)
def test_parse_rejects_malformed(text, message):
    with pytest.raises(ValueError, match=message):
        parse_formula(text)


def test_make_formula_rejects_empty_step():
    with pytest.raises(ValueError, match="step 2 must be a non-empty"):
        make_formula([[(1, 1)], []])


def test_from_strings_orders_by_depth_and_computes_parents():
    g = DraftGraph.from_strings(["(1,1)|(2,1)", "(1,1)", "(2,1)", "(1,1)|(2,1)|(3,1)"], model="m")
    assert g.strings() == ["", "(1,1)", "(2,1)", "(1,1)|(2,1)", "(1,1)|(2,1)|(3,1)"]
    assert g.parents == (-1, 0, 0, 1, 3)
    assert g.budget == 4
    assert g.max_depth == 3
    assert g.max_vocab_rank == 1
    assert g.model == "m"


def test_json_round_trip(tmp_path):
    g = DraftGraph.from_strings(
        ["(1,1)", "(1,2)", "(1,1)+(2,1)", "(1,1)|(2,3)"], model="toy", depth_cap=3, provenance={"samples": 50}
    )
    path = tmp_path / "g.json"
    g.to_json(path)
    back = DraftGraph.load(path, expect_budget=4)
    assert back == g
    assert back.nodes == g.nodes and back.parents == g.parents
    assert back.provenance == {"samples": 50}
    assert back.depth_cap == 3 and back.model == "toy"
    data = json.loads(path.read_text())
    assert data["nodes"][0] == "" and data["parents"][0] == -1 and data["version"] == 1


def test_restricted():
    g = DraftGraph.from_strings(["(1,1)", "(1,1)|(2,1)", "(2,1)", "(1,1)|(2,1)|(3,1)"], model="m")
    r = g.restricted(2)
    assert r.strings() == ["", "(1,1)", "(2,1)", "(1,1)|(2,1)"]
    assert r.parents == (-1, 0, 0, 1)
    assert r.budget == 3 and r.depth_cap == 2
    assert r.restricted(1).strings() == ["", "(1,1)", "(2,1)"]


def _write(tmp_path, **overrides):
    data = {
        "format": "specfold.draft_graph",
        "version": 1,
        "model": "m",
        "budget": 2,
        "depth_cap": None,
        "nodes": ["", "(1,1)", "(1,1)|(2,1)"],
        "parents": [-1, 0, 1],
        "provenance": {},
    }
    data.update(overrides)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    return path


def test_load_valid_baseline(tmp_path):
    g = DraftGraph.load(_write(tmp_path))
    assert g.strings() == ["", "(1,1)", "(1,1)|(2,1)"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"version": 2}, "unknown draft-graph format version 2"),
        ({"format": "other"}, "not a draft-graph file"),
        ({"nodes": ["", "(1,1)|(2,1)", "(2,1)"], "parents": [-1, 0, 0]}, "missing parent"),
        ({"parents": [-1, 2, 1]}, "parent index 2 is not < its own index 1"),
        ({"parents": [-1, 1, 1]}, "parent index 1 is not < its own index 1"),
        ({"parents": [-1, 0, 0]}, "parent index 0 points to 'root', not its formula-parent '\\(1,1\\)'"),
        ({"nodes": ["", "(1,1)", "(1,1)"], "parents": [-1, 0, 0]}, "duplicate node '\\(1,1\\)' at indices 1 and 2"),
        ({"budget": 3}, "budget mismatch: file says budget 3 but holds 2"),
        ({"depth_cap": 1}, "depth 2 above depth_cap 1"),
        ({"nodes": ["", "(0,1)", "(0,1)|(2,1)"]}, "node 1: .*malformed pair \\(0,1\\)"),
        ({"nodes": ["", "(1,x)", "(1,1)|(2,1)"]}, "node 1: malformed pair"),
        ({"nodes": ["(1,1)", "", "(1,1)|(2,1)"]}, "node 0 must be the root"),
        ({"parents": [-1, 0]}, "3 nodes but 2 parent indices"),
    ],
)
def test_load_validation_errors(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        DraftGraph.load(_write(tmp_path, **overrides))


def test_expect_budget_mismatch(tmp_path):
    with pytest.raises(ValueError, match="budget mismatch: expected budget 7, the file's graph has 2"):
        DraftGraph.load(_write(tmp_path), expect_budget=7)


def test_invalid_json(tmp_path):
    path = tmp_path / "g.json"
    path.write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        DraftGraph.load(path)


def test_direct_construction_validates():
    one = parse_formula("(1,1)")
    two = parse_formula("(1,1)|(2,1)")
    with pytest.raises(ValueError, match="missing parent"):
        DraftGraph(nodes=(ROOT, two), parents=(-1, 0))
    with pytest.raises(ValueError, match="budget mismatch: budget says 5 but the graph holds 2"):
        DraftGraph(nodes=(ROOT, one, two), parents=(-1, 0, 1), budget=5)
    with pytest.raises(ValueError, match="root's parent index must be -1"):
        DraftGraph(nodes=(ROOT, one), parents=(0, 0))


def test_from_formulas_errors():
    with pytest.raises(ValueError, match="missing parent"):
        DraftGraph.from_strings(["(1,1)|(2,1)"])
    with pytest.raises(ValueError, match="duplicate node"):
        DraftGraph.from_strings(["(1,1)", "(1,1)"])
    with pytest.raises(ValueError, match="above depth_cap 1"):
        DraftGraph.from_strings(["(1,1)", "(1,1)|(2,1)"], depth_cap=1)
