"""The Grafana dashboard: the committed JSON is the builder's output, its reference lines
are the receipt's p50/p99, it has the panels operating K3 needs, and it ships as a
ConfigMap with Grafana's sidecar label when k3:monitoring.dashboard is set."""
from __future__ import annotations

import json

import pytest

from k3infra.operations import dashboard as d
from k3infra.plan import reference_latency
from k3infra.receipt import load_receipt, parse_receipt

from conftest import GOOD_REVISION, ROOT, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"
FILE = ROOT / "charts" / "dashboards" / d.FILE_NAME


def panel(board: dict, title: str) -> dict:
    (found,) = [p for p in board["panels"] if p["title"] == title]
    return found


def test_committed_json_is_the_builders_output(receipt):
    assert FILE.read_text() == d.dashboard_json(receipt, reference_latency(receipt)), (
        "charts/dashboards/kimi-k3-vllm.json is stale: regenerate it with "
        "`python -m k3infra.operations.dashboard charts/dashboards/kimi-k3-vllm.json`")


def test_reference_lines_are_the_receipts_p50_and_p99(receipt):
    board = json.loads(FILE.read_text())
    ref = reference_latency(receipt)
    legends = d.reference_legends(receipt, ref)
    targets = {t["legendFormat"]: t["expr"]
               for t in panel(board, "End-to-end request latency")["targets"]}
    assert float(targets[legends["p50"]].removeprefix("vector(").removesuffix(")")) == \
        pytest.approx(ref.p50_ms / 1000)
    assert float(targets[legends["p99"]].removeprefix("vector(").removesuffix(")")) == \
        pytest.approx(ref.p99_ms / 1000)
    assert {"p50", "p99"} <= set(targets)
    styled = {o["matcher"]["options"] for o in
              panel(board, "End-to-end request latency")["fieldConfig"]["overrides"]}
    assert styled == set(legends.values())


def test_reference_lines_follow_a_different_receipt():
    data = load_receipt().model_dump(by_alias=True)
    data["measured"] = [{**x, "p50_ms": 12000, "p99_ms": 15500} for x in data["measured"]]
    other = parse_receipt(data)
    board = d.dashboard(other, reference_latency(other))
    exprs = [t["expr"] for t in panel(board, "End-to-end request latency")["targets"]]
    assert "vector(12.0)" in exprs and "vector(15.5)" in exprs


def test_panels_cover_what_operating_k3_needs(receipt):
    board = d.dashboard(receipt, reference_latency(receipt))
    titles = [p["title"] for p in board["panels"]]
    for title in ("Requests per second", "Running and waiting requests",
                  "End-to-end request latency", "Time to first token", "Inter-token latency",
                  "Tokens/s per GPU", "Tokens/s per node", "KV-cache usage", "Preemptions"):
        assert title in titles
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in board["panels"]}
    assert "vllm:time_to_first_token_seconds_bucket" in exprs["Time to first token"]
    assert "vllm:inter_token_latency_seconds_bucket" in exprs["Inter-token latency"]
    assert "histogram_quantile(0.99" in exprs["End-to-end request latency"]
    assert "histogram_quantile(0.5" in exprs["End-to-end request latency"]
    gpus = receipt.measured_gpu.gpus_per_node
    assert exprs["Tokens/s per GPU"].count(f"/ {gpus}") == 2
    assert "vllm:num_requests_waiting" in exprs["Running and waiting requests"]
    assert "vllm:num_preemptions_total" in exprs["Preemptions"]


def test_dashboard_structure_grafana_accepts(receipt):
    board = d.dashboard(receipt, reference_latency(receipt))
    assert board["uid"] == d.UID and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        cell = (g["x"], g["y"])
        assert cell not in cells
        cells.add(cell)
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        assert p["datasource"]["uid"] == "${datasource}"
    variables = [v["name"] for v in board["templating"]["list"]]
    assert variables == ["datasource", "namespace", "pod"]


def test_configmap_has_the_sidecar_label_and_the_json(receipt):
    r = render("existing", PIN, 'monitoring={"dashboard": true}')
    cm = manifest(r, "ConfigMap", "kimi-k3-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "kimi-k3"   # k3:namespace unset: the instance name
    assert json.loads(cm["data"][d.FILE_NAME]) == d.dashboard(receipt, reference_latency(receipt))


def test_configmap_goes_where_grafana_looks():
    r = render("existing", PIN, 'monitoring={"dashboard": true, "dashboardNamespace": "grafana"}')
    assert manifest(r, "ConfigMap", "kimi-k3-dashboard")["metadata"]["namespace"] == "grafana"


def test_regenerate_command_writes_the_committed_file(tmp_path, receipt):
    out = tmp_path / "board.json"
    assert d.main([str(out)]) == 0
    assert out.read_text() == FILE.read_text()
    assert d.main([]) == 2


def test_cost_panel_only_with_a_configured_node_rate(receipt):
    import promql_parser

    titles = [p["title"] for p in d.dashboard(receipt, reference_latency(receipt))["panels"]]
    assert "USD per million generated tokens" not in titles           # no rate, no panel
    r = render("existing", PIN, 'monitoring={"dashboard": true, "nodeRateUsdPerHour": 90}')
    board = json.loads(manifest(r, "ConfigMap", "kimi-k3-dashboard")["data"][d.FILE_NAME])
    p = panel(board, "USD per million generated tokens")
    (target,) = p["targets"]
    # 90 USD/h = 0.025 USD/s; x 1e6 over the node's generated tokens per second
    assert target["expr"] == ('0.025 * 1e6 / (sum by (pod) (rate(vllm:generation_tokens_total'
                              '{namespace="$namespace", pod=~"$pod"}[$__rate_interval])) > 0)')
    promql_parser.parse(target["expr"].replace("$__rate_interval", "5m"))
    assert p["fieldConfig"]["defaults"]["unit"] == "currencyUSD"
    assert "90 USD per node-hour" in p["description"]
    # the committed JSON (no rate) is unchanged by the option
    assert json.loads(FILE.read_text()) == d.dashboard(receipt, reference_latency(receipt))


def test_node_rate_must_be_positive(tmp_path, capsys):
    from k3infra.cli import main

    rc = main(["render", "--stack", "existing", "--config", PIN, "--config",
               'monitoring={"nodeRateUsdPerHour": 0}', "--out", str(tmp_path)])
    assert rc != 0
    assert "k3:monitoring.nodeRateUsdPerHour" in capsys.readouterr().err
