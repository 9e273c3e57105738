"""inspect-artifact says the same facts under the same labels for every family: one tiny
artifact per family (dense, hybrid MoE, GLM MoE, Gemma 4, Nemotron-H MoE) from
`ninfer init-random --preset`, their JSON `model` entries and readable lines compared."""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from ninfer_jax.cli.main import main

# preset -> (has MoE, has state layers, has sliding layers)
FAMILIES = {"qwen3-tiny": (False, False, False), "qwen3.6-tiny-moe": (True, True, False),
            "glm4.5-tiny": (True, False, False), "gemma4-tiny": (False, False, True),
            "nemotron-3-nano-tiny": (True, True, False)}
ALWAYS = {"layer types", "full attn", "attn options", "KV/token", "extras"}


@pytest.fixture(scope="module")
def inspected(tmp_path_factory):
    """preset -> (JSON report, {label: rest of line} of the readable report)."""
    root = tmp_path_factory.mktemp("families")
    reports = {}
    for preset in FAMILIES:
        out = root / f"{preset}.ninfer"
        made = CliRunner().invoke(main, ["init-random", "--preset", preset, str(out),
                                         "--no-drafters", "--quiet"], catch_exceptions=False)
        assert made.exit_code == 0, made.output
        as_json = CliRunner().invoke(main, ["inspect-artifact", str(out), "--json"])
        text = CliRunner().invoke(main, ["inspect-artifact", str(out)])
        assert as_json.exit_code == text.exit_code == 0, as_json.output + text.output
        header = text.output.split("\n\n")[0].splitlines()
        reports[preset] = (json.loads(as_json.output),
                           {line[:14].strip(): line[14:] for line in header})
    return reports


def test_every_family_reports_the_same_json_facts(inspected):
    models = {preset: report["model"] for preset, (report, _) in inspected.items()}
    assert {tuple(m) for m in models.values()} == {
        ("layers", "attention", "state", "kv", "moe", "mtp", "extras")}
    assert len({tuple(m["attention"]["options"]) for m in models.values()}) == 1
    assert len({tuple(m["kv"]) for m in models.values()}) == 1
    assert len({tuple(m["extras"]) for m in models.values()}) == 1
    kinds = [facts for m in models.values() for facts in m["attention"]["kinds"].values()]
    assert len({tuple(facts) for facts in kinds}) == 1
    for preset, (has_moe, has_state, has_sliding) in FAMILIES.items():
        model = models[preset]
        assert (model["moe"] is not None, model["state"] is not None) == (has_moe, has_state)
        assert ("sliding" in model["attention"]["kinds"]) == has_sliding
        assert sum(model["layers"]["counts"].values()) == \
            inspected[preset][0]["metadata"]["config"]["num_layers"]
    assert len({tuple(m["moe"]) for m in models.values() if m["moe"]}) == 1
    assert len({tuple(m["state"]) for m in models.values() if m["state"]}) == 1


def test_every_family_labels_its_lines_alike(inspected):
    for preset, (has_moe, has_state, has_sliding) in FAMILIES.items():
        lines = inspected[preset][1]
        assert ALWAYS <= set(lines), preset
        assert ("MoE" in lines, "state/seq" in lines, "sliding attn" in lines) == (
            has_moe, has_state, has_sliding), preset
        assert "moe" not in lines and "mamba-2" not in lines, preset  # no per-family labels


def test_the_moe_line_reads_alike_whatever_the_router(inspected):
    shape = re.compile(r"8 (swiglu|relu2) experts of 32, top-2( renormalised)?, shared expert "
                       r"of \d+( \(gated\))?, dense layers \[[\d, ]*\]; router "
                       r"(softmax|sigmoid \+ correction bias), top-1 of 1 groups, scaling \S+")
    moe_lines = {p: inspected[p][1]["MoE"] for p, (has_moe, _, _) in FAMILIES.items() if has_moe}
    for preset, line in moe_lines.items():
        assert shape.fullmatch(line), (preset, line)
    assert "relu2" in moe_lines["nemotron-3-nano-tiny"]
    assert "router softmax" in moe_lines["qwen3.6-tiny-moe"]
    assert "dense layers [0]" in moe_lines["glm4.5-tiny"]


def test_the_state_lines_name_their_mixer(inspected):
    assert "1 gated_deltanet layer(s) of 2 groups" in inspected["qwen3.6-tiny-moe"][1]["state/seq"]
    assert "1 mamba2 layer(s) of 2 groups" in inspected["nemotron-3-nano-tiny"][1]["state/seq"]
