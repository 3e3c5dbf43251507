"""Structural checks of the dashboard JSON and the compose stack.

Grafana and Docker do not run on CI machines, so the JSON is validated against what
Grafana 10-12 import (schemaVersion, panel types, datasource references, ids, grid) and
the compose file with Debian's docker-compose (schema) plus checks of our own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests
import yaml

from dashboards.boards import GENERATED, MAX_DATA_POINTS, SCHEMA_VERSION
from dashboards.catalogue import BOARDS, DATASOURCE_UID, ENGINE_COLORS, MIXIN, VM_DATASOURCE_UID

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
VALID_UNITS = {"s", "percent", "percentunit", "short", "gbytes", "hertz", "watt", "celsius", "suffix: tok/s", "reqps"}


def _boards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in GENERATED.glob("*.json")}


def _overlap(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_board_structure(name: str) -> None:
    board = _boards()[name]
    assert board["schemaVersion"] == SCHEMA_VERSION >= 36
    assert board["uid"] == BOARDS[name].uid and len(board["uid"]) <= 40
    assert "rows" not in board
    rows = [p for p in board["panels"] if p["type"] == "row"]
    assert [r["title"] for r in rows] == [r.title for r in BOARDS[name].rows]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len(panels) == len(BOARDS[name].panels)
    titles = {p.key: p.title for p in BOARDS[name].panels}
    for row, spec in zip(rows, BOARDS[name].rows):  # a heading across the board, right above its first panel
        first = next(p for p in panels if p["title"] == titles[spec.first])
        assert row["gridPos"]["w"] == 24 and row["gridPos"]["x"] == 0
        assert row["gridPos"]["y"] + row["gridPos"]["h"] == first["gridPos"]["y"]
        assert not any(_overlap(row["gridPos"], p["gridPos"]) for p in panels)
    for i, p in enumerate(panels):
        assert p["type"] in ("timeseries", "stat"), p["type"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["maxDataPoints"] == MAX_DATA_POINTS > 100
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0 and g["w"] > 0
        for q in panels[i + 1:]:
            assert not _overlap(g, q["gridPos"]), (p["title"], q["title"])
        assert p["fieldConfig"]["defaults"]["unit"] in VALID_UNITS
        assert p["targets"]
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert t["expr"].strip() and t["refId"] and t["legendFormat"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
    variables = {v["name"]: v for v in board["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert ds["current"]["value"] == DATASOURCE_UID
    used = set(re.findall(r"\$(\w+)", json.dumps(panels))) - {"__range", "datasource"}
    assert used <= set(variables), used - set(variables)


def test_comparison_board_reproduces_the_seed() -> None:
    board = _boards()["comparison"]
    by_title = {p["title"]: p for p in board["panels"]}
    grid = [by_title[t] for t in ("TTFT P95", "Per-request TPOT P95", "Successful output throughput",
                                  "Full-stream E2E P95")]
    assert all(p["type"] == "timeseries" for p in grid)
    xs = sorted((p["gridPos"]["y"], p["gridPos"]["x"]) for p in grid)
    assert len({y for y, _ in xs}) == 2 and len({x for _, x in xs}) == 2  # a 2x2 grid
    stats = [p for p in board["panels"] if p["type"] == "stat"]
    assert {p["title"] for p in stats} == {"Success ratio", "Goodput (SLO met)", "Failures by reason",
                                           "Empty-text HTTP 200 responses"}
    assert max(p["gridPos"]["y"] for p in stats) < min(p["gridPos"]["y"] for p in grid)  # stat row above
    for p in grid:
        want = ("rate(llmbench_output_tokens_total" if p["title"] == "Successful output throughput"
                else "histogram_quantile(0.95")
        assert want in p["targets"][0]["expr"], (p["title"], p["targets"][0]["expr"])
        colors = {o["matcher"]["options"]: o["properties"][0]["value"]["fixedColor"] for o in p["fieldConfig"]["overrides"]}
        assert colors == {f"^{e}.*": c for e, c in ENGINE_COLORS.items()}
    assert ENGINE_COLORS["sglang"] == "#1f77b4" and ENGINE_COLORS["vllm"] == "#ff7f0e"  # blue, orange
    assert by_title["TTFT P95"]["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 3.0
    assert by_title["Per-request TPOT P95"]["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.05
    ann = {a["name"]: a for a in board["annotations"]["list"] if a.get("expr")}
    for which, name in (("start", "Round starts"), ("end", "Round ends")):
        a = ann[name]  # each round's start and end, at the gauge's own time (SPEC section 16)
        assert f"llmbench_scenario_round_{which}_timestamp_seconds{{" in a["expr"] and a["expr"].endswith("* 1000")
        assert a["useValueForTime"] is True and a["datasource"]["uid"] == "${datasource}"
        assert "{{scenario}}" in a["titleFormat"] and "{{round}}" in a["titleFormat"]
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "engine", "scenario"}


def test_goodput_panels_in_engine_colours() -> None:
    by_title = {p["title"]: p for p in _boards()["comparison"]["panels"]}
    for title in ("Goodput (SLO met)", "Goodput ratio (1-minute windows)", "Goodput throughput"):
        p = by_title[title]
        colors = {o["matcher"]["options"]: o["properties"][0]["value"]["fixedColor"] for o in p["fieldConfig"]["overrides"]}
        assert colors == {"^sglang.*": "#1f77b4", "^vllm.*": "#ff7f0e"}, title
    stat, ratio = by_title["Goodput (SLO met)"], by_title["Goodput ratio (1-minute windows)"]
    for p in (stat, ratio):
        expr = p["targets"][0]["expr"]
        assert 'llmbench_slo_requests_total{job="llmbench-exporter", result="met"' in expr
        assert 'llmbench_requests_total{job="llmbench-exporter", outcome!="client_abort"' in expr  # failures count
        steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert steps == [{"color": "red", "value": None}, {"color": "green", "value": MIXIN.goodput_ratio_min}]
    assert "llmbench_goodput_tokens_total" in by_title["Goodput throughput"]["targets"][0]["expr"]
    assert by_title["Goodput throughput"]["fieldConfig"]["defaults"]["unit"] == "suffix: tok/s"


def test_gpu_board_tolerates_both_hostname_labels() -> None:
    board = _boards()["gpu"]
    for p in board["panels"]:
        expr = p["targets"][0]["expr"]
        assert "Hostname=~" in expr and "hostname=~" in expr and "DCGM_FI_DEV_" in expr
    host = next(v for v in board["templating"]["list"] if v["name"] == "host")
    assert re.search(host["regex"].strip("/"), 'x{hostname="h1"}') and re.search(host["regex"].strip("/"), 'x{Hostname="h1"}')
    titles = {p["title"] for p in board["panels"]}
    assert {"Framebuffer used", "SM clock", "GPU utilisation", "Power draw", "GPU temperature"} == titles


def test_internals_board_has_both_engines() -> None:
    ttft = next(p for p in _boards()["internals"]["panels"] if p["title"].startswith("TTFT P95"))
    styles = {o["matcher"]["options"]: o["properties"][0]["value"]["fill"]
              for o in ttft["fieldConfig"]["overrides"] if o["properties"][0]["id"] == "custom.lineStyle"}
    # engine vs proxy vs queue vs mean, same colour
    assert styles == {".*proxy.*": "dash", ".*queue.*": "dot", ".*mean.*": "dash"}
    exprs = " ".join(t["expr"] for p in _boards()["internals"]["panels"] if p["type"] != "row" for t in p["targets"])
    for name in ("vllm:num_requests_running", 'sglang[:_]num_running_reqs"', "vllm:kv_cache_usage_perc",
                 'sglang[:_]token_usage"', "vllm:request_queue_time_seconds_bucket", "llmbench_time_to_first_token_seconds"):
        assert name in exprs


def test_internals_board_shows_the_proxy_timing_error() -> None:
    board = _boards()["internals"]
    p = next(p for p in board["panels"] if p["title"] == "Proxy timing error")
    lag, p95, worst, ttft, added = (t["expr"] for t in p["targets"])
    assert lag.startswith("histogram_quantile(0.99, sum by (instance, worker, le) (rate(llmbench_proxy_event_loop_lag_seconds_bucket{")
    for q, expr in ((0.95, p95), (1, worst)):  # the requests' own error, per engine
        assert expr.startswith(f"histogram_quantile({q}, sum by (engine, le) "
                               "(rate(llmbench_request_timing_uncertainty_seconds_bucket{")
    assert 'instance=~"$instance"' in lag and "llmbench_time_to_first_token_seconds_bucket" in ttft
    # what the proxy added to its clients' TTFT, beside the error (SPEC 27)
    assert added.startswith("histogram_quantile(0.95, sum by (engine, le) (rate(llmbench_proxy_added_seconds_bucket{")
    assert p["fieldConfig"]["defaults"]["custom"]["scaleDistribution"]["type"] == "linear"  # two axes, not one log axis
    assert p["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == MIXIN.proxy_lag_max_s == 0.001
    # the three error series on an axis of their own (right, labelled), the TTFT on the left
    right = [o for o in p["fieldConfig"]["overrides"]
             if {"id": "custom.axisPlacement", "value": "right"} in o["properties"]]
    names = ["loop lag P99 proxy-a:9464 1", "vllm timing error P95", "sglang timing error max", "vllm proxy added P95",
             "vllm proxy TTFT P95"]
    on_right = [n for n in names if any(re.fullmatch(o["matcher"]["options"], n) for o in right)]
    assert on_right == names[:4]
    assert all({"id": "custom.axisLabel", "value": "timing error"} in o["properties"] for o in right)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["instance"]["query"] == 'label_values(up{job="llmbench-exporter"}, instance)'
    assert variables["engine_instance"]["includeAll"] and variables["engine_instance"]["allValue"] == ".*"
    engine_exprs = [t["expr"] for q in board["panels"] for t in q.get("targets", []) if "vllm:" in t["expr"] or "sglang" in t["expr"]]
    assert engine_exprs and all('instance=~"$engine_instance"' in e for e in engine_exprs)


def test_engine_p95s_come_with_their_exact_means() -> None:
    """Beside every engine-side P95, rate(_sum) / rate(_count) of the same histogram and engine."""
    p = next(p for p in _boards()["internals"]["panels"] if p["title"].startswith("TTFT P95"))
    legends = {t["legendFormat"]: t["expr"] for t in p["targets"]}
    p95s = [name for name in legends if name.endswith(" P95") and "proxy" not in name]
    assert len(p95s) == 3
    for name in p95s:
        metric = re.search(r"(\w+)_bucket", legends[name]).group(1)
        mean = legends[name[:-len("P95")] + "mean"]
        assert re.fullmatch(rf"sum\(rate\(.*{metric}_sum.*\[1m\]\)\) / sum\(rate\(.*{metric}_count.*\[1m\]\)\)", mean)


# -- compose -----------------------------------------------------------------------------------

def _compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


@pytest.mark.slow  # a subprocess or a whole-tree tool: runs in the full suite
def test_compose_with_docker_compose_schema() -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        if os.environ.get("LLMBENCH_REQUIRE_PROMETHEUS") == "1":
            pytest.fail("docker-compose not installed (apt-get install docker-compose)")
        pytest.skip("docker-compose not installed")
    env = {**os.environ, "GRAFANA_ADMIN_PASSWORD": "test-only"}
    # each profile, in parallel (about a second each)
    runs = {" ".join(profile) or "base": subprocess.Popen(
        [binary, "-f", str(COMPOSE / "docker-compose.yml"), *profile, "config", "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for profile in ([], ["--profile", "gpu", "--profile", "render"], ["--profile", "scale"])}
    for name, proc in runs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (name, err)
    # without a password, compose refuses: no undocumented default admin password
    env.pop("GRAFANA_ADMIN_PASSWORD")
    r = subprocess.run([binary, "-f", str(COMPOSE / "docker-compose.yml"), "config", "-q"],
                       capture_output=True, text=True, env=env, timeout=120, cwd=COMPOSE)
    assert r.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in r.stderr


def test_compose_structure() -> None:
    doc = _compose()
    services = doc["services"]
    assert {"prometheus", "grafana", "exporter", "vllm", "sglang", "loadgen", "dcgm-exporter", "renderer"} <= set(services)
    # the load generator's plan is in the image (the Dockerfile copies examples/)
    assert "/app/examples/plans/demo.yaml" in services["loadgen"]["command"][0]
    assert (ROOT / "examples/plans/demo.yaml").exists() and "COPY examples" in (COMPOSE / "Dockerfile").read_text()
    assert services["dcgm-exporter"]["profiles"] == ["gpu"] and services["renderer"]["profiles"] == ["render"]
    base = {n for n, svc in services.items() if "profiles" not in svc}
    assert {"prometheus", "grafana", "exporter", "vllm", "sglang", "loadgen"} == base
    for name, svc in services.items():
        image = svc["image"]
        assert ":" in image and not image.endswith(":latest"), (name, image)  # pinned
        for port in svc.get("ports", []):
            assert port.startswith("${BIND_ADDR:-127.0.0.1}:"), (name, port)  # loopback by default
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (COMPOSE / src).resolve().exists(), (name, src)  # every mounted path exists
    env = services["grafana"]["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert "GRAFANA_ADMIN_PASSWORD=" in (COMPOSE / ".env.example").read_text()
    assert env["GF_RENDERING_SERVER_URL"].startswith("http://renderer:")
    build = services["exporter"]["build"]
    assert (COMPOSE / build["context"] / build["dockerfile"]).exists()


def test_compose_provisioning_matches_dashboards() -> None:
    ds = yaml.safe_load((COMPOSE / "grafana/provisioning/datasources/prometheus.yaml").read_text())["datasources"][0]
    assert ds["uid"] == DATASOURCE_UID and ds["url"] == "http://prometheus:9090"
    prov = yaml.safe_load((COMPOSE / "grafana/provisioning/dashboards/llm-bench.yaml").read_text())["providers"][0]
    mounts = dict(v.split(":")[:2][::-1] for v in _compose()["services"]["grafana"]["volumes"])
    assert (COMPOSE / mounts[prov["options"]["path"]]).resolve() == GENERATED
    prom = yaml.safe_load((ROOT / "prometheus/prometheus.yml").read_text())
    targets = {j["job_name"]: j["static_configs"][0]["targets"][0] for j in prom["scrape_configs"]}
    services = _compose()["services"]
    for job, target in targets.items():
        assert target.split(":")[0] in services, (job, target)
    exporter_cfg = yaml.safe_load((COMPOSE / "exporter.yaml").read_text())
    from exporter.proxy.config import validate

    cfg = validate(exporter_cfg)
    assert cfg.listen.endswith(":9464") and targets["llmbench-exporter"] == "exporter:9464"
    assert {e.base_url for e in cfg.engines} == {"http://sglang:30000", "http://vllm:8000"}


def _scale_services() -> dict[str, dict]:
    return {n: s for n, s in _compose()["services"].items() if "scale" in s.get("profiles", [])}


def _networks(svc: dict) -> dict[str, list[str]]:
    """A service's networks and its aliases on each (compose puts it on ``default`` by default)."""
    nets = svc.get("networks") or ["default"]
    if isinstance(nets, list):
        return {n: [] for n in nets}
    return {n: list((v or {}).get("aliases", [])) for n, v in nets.items()}


def _resolve(services: dict[str, dict], client: str, host: str) -> str:
    """The one service that answers to ``host`` on ``client``'s networks (compose's DNS)."""
    answering = {name for name, svc in services.items() for net, aliases in _networks(svc).items()
                 if net in _networks(services[client]) and host in (name, *aliases)}
    assert len(answering) == 1, (client, host, answering)  # neither unknown nor ambiguous
    return answering.pop()


def test_compose_scale_profile_two_sites_one_store() -> None:
    """Site b repeats site a (one proxy config, one agent config) on a network of its own, where
    its services answer to site a's host names; both agents forward to VictoriaMetrics."""
    from exporter.proxy.config import validate

    services, scale = _compose()["services"], _scale_services()
    assert set(scale) == {"exporter-b", "vllm-b", "sglang-b", "loadgen-b", "prometheus-agent-a",
                          "prometheus-agent-b", "victoriametrics"}
    vm = scale["victoriametrics"]
    assert re.fullmatch(r"victoriametrics/victoria-metrics:v\d+\.\d+\.\d+", vm["image"])  # pinned
    assert "-httpListenAddr=:8428" in vm["command"]
    # two proxies with the one config, each in front of its own engine pair; a load generator through each
    cfg = validate(yaml.safe_load((COMPOSE / "exporter.yaml").read_text()))
    assert {e.name for e in cfg.engines} == set(ENGINE_COLORS)  # the same engine names: summed by engine
    hosts = {e.base_url.split("//")[1].split(":")[0] for e in cfg.engines}
    site_of = {"exporter": "a", "exporter-b": "b"}
    for proxy, site in site_of.items():
        assert "./exporter.yaml:/etc/llm-bench/exporter.yaml:ro" in services[proxy]["volumes"]
        upstreams = {_resolve(services, proxy, h) for h in hosts}
        assert upstreams == ({"vllm", "sglang"} if site == "a" else {"vllm-b", "sglang-b"})
    assert "off" in scale["exporter-b"]["command"]  # the GPU board has site a's simulated GPUs
    for loadgen, proxy in (("loadgen", "exporter"), ("loadgen-b", "exporter-b")):
        assert _resolve(services, loadgen, "exporter") == proxy
        assert services[loadgen]["command"] == services["loadgen"]["command"]
    # one Prometheus agent per site, one config, both forwarding to VictoriaMetrics with their site label
    scraped = set()
    for site in ("a", "b"):
        name = f"prometheus-agent-{site}"
        agent = scale[name]
        assert {"--enable-feature=agent", "--enable-feature=expand-external-labels"} <= set(agent["command"])
        assert agent["environment"] == {"SITE": site}
        src = next(v.split(":")[0] for v in agent["volumes"] if v.endswith("/etc/prometheus/prometheus.yml:ro"))
        assert src == "./scale/prometheus-agent.yml"
        doc = yaml.safe_load((COMPOSE / src).read_text())
        assert doc["global"]["external_labels"]["site"] == "${SITE}"
        assert [w["url"] for w in doc["remote_write"]] == ["http://victoriametrics:8428/api/v1/write"]
        assert _resolve(services, name, "victoriametrics") == "victoriametrics"
        jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in doc["scrape_configs"]}
        assert MIXIN.job in jobs and {MIXIN.vllm_job, MIXIN.sglang_job} <= set(jobs)  # the boards' selectors
        scraped |= {_resolve(services, name, t.split(":")[0]) for ts in jobs.values() for t in ts}
    assert {"exporter", "exporter-b", "vllm", "vllm-b", "sglang", "sglang-b"} == scraped


def _start_agent(agent: dict, config: Path, data: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The compose service's own Prometheus flags and environment, with local paths, on port 0;
    the process and the port it bound."""
    from tests.helpers import listening_port

    local = {"--config.file": str(config), "--storage.agent.path": str(data)}
    args = [a if a.split("=")[0] not in local else f"{a.split('=')[0]}={local[a.split('=')[0]]}" for a in agent["command"]]
    proc = subprocess.Popen(["prometheus", *args, "--web.listen-address=127.0.0.1:0"],
                            env={**os.environ, **agent["environment"]}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        return proc, listening_port(proc.pid, timeout_s=20)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def _agent_config(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            r = requests.get(f"http://127.0.0.1:{port}/api/v1/status/config", timeout=2)
            if r.status_code == 200:
                return yaml.safe_load(r.json()["data"]["yaml"])
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the agent on :{port} did not come up (exit status {proc.poll()})")


@pytest.mark.slow  # promtool and two Prometheus agents: runs in the full suite
def test_compose_scale_agents_run_the_one_config_with_their_site(tmp_path: Path) -> None:
    """promtool accepts the agent config, and Prometheus, run with each agent service's flags and
    environment, labels its samples with that site."""
    from tests.helpers import require_prometheus

    require_prometheus()
    config = COMPOSE / "scale/prometheus-agent.yml"
    r = subprocess.run(["promtool", "check", "config", "--agent", str(config)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    agents = {site: _scale_services()[f"prometheus-agent-{site}"] for site in ("a", "b")}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ports: dict[str, int] = {}
    try:
        for site, agent in agents.items():
            procs[site], ports[site] = _start_agent(agent, config, tmp_path / site)
        for site, proc in procs.items():
            labels = _agent_config(ports[site], proc)["global"]["external_labels"]
            assert labels == {"stack": "llm-bench", "site": site}
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=30)


def test_grafana_reads_victoriametrics_as_second_datasource() -> None:
    ds = yaml.safe_load((COMPOSE / "grafana/provisioning/datasources/victoriametrics.yaml").read_text())["datasources"]
    assert len(ds) == 1 and ds[0]["uid"] == VM_DATASOURCE_UID and ds[0]["type"] == "prometheus"
    assert ds[0]["url"] == "http://victoriametrics:8428" and not ds[0]["isDefault"]
    # the boards' data-source menu lists every Prometheus-type source, VictoriaMetrics included
    for board in _boards().values():
        var = next(v for v in board["templating"]["list"] if v["name"] == "datasource")
        assert var["query"] == ds[0]["type"]
