"""The Kubernetes manifests of ``dashboards --k8s`` (SPEC section 17), validated offline.

* Core kinds (ConfigMap, PersistentVolumeClaim, Deployment, Service): kubernetes-validate (PyPI),
  which ships the Kubernetes API's JSON schemas, in its strict mode (unknown fields refused).
* ServiceMonitor and PrometheusRule: the prometheus-operator CRDs' openAPIV3Schema, vendored in
  ``k8s_schemas/`` (see each file's ``$comment``), with ``jsonschema``, plus a strict walk that
  refuses fields the schema does not list (the API server would silently drop them).
* The rule groups inside the PrometheusRule pass ``promtool check rules``.

Everything is compared with ``dashboards/generated`` and ``prometheus/rules`` as they are at
test time, so a board or rule changed without regenerating the manifests fails here.
"""

from __future__ import annotations

import copy
import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from dashboards.__main__ import main as dashboards_main
from dashboards.boards import GENERATED
from dashboards.k8s import K8S_DIR, InputError, render_manifests
from dashboards.mixin import CONFIG as MIXIN
from dashboards.rules import RULES_FILE
from exporter.proxy.config import validate as validate_config

from tests.helpers import require_prometheus

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = Path(__file__).resolve().parent / "k8s_schemas"
CRD_SCHEMAS = {"ServiceMonitor": "servicemonitor-monitoring-v1.json", "PrometheusRule": "prometheusrule-monitoring-v1.json"}
#: the oldest Kubernetes minor still in upstream support when written, and the newest bundled
K8S_VERSIONS = ("1.31.0", kubernetes_validate.utils.latest_version())


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _parsed() -> str:
    docs = {p.name: [d for d in yaml.load_all(p.read_text(), Loader=_LOADER) if d] for p in sorted(K8S_DIR.glob("*.yaml"))}
    return json.dumps(docs)


def _committed() -> dict[str, list[dict[str, Any]]]:
    """The manifests on disk, parsed once (a fresh copy per call: tests may change it)."""
    result: dict[str, list[dict[str, Any]]] = json.loads(_parsed())
    return result


def _objects() -> list[dict[str, Any]]:
    return [obj for docs in _committed().values() for obj in docs]


def _kind(kind: str) -> list[dict[str, Any]]:
    return [o for o in _objects() if o["kind"] == kind]


def _crd_validator(kind: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads((SCHEMAS / CRD_SCHEMAS[kind]).read_text()))


def _unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields of ``obj`` that ``schema`` does not list (metadata is checked by the core schemas)."""
    if isinstance(obj, dict) and "properties" in schema:
        out = []
        for key, value in obj.items():
            if key not in schema["properties"]:
                out.append(f"{path}.{key}")
            elif key != "metadata":
                out += _unknown_fields(value, schema["properties"][key], f"{path}.{key}")
        return out
    if isinstance(obj, list) and "items" in schema:
        return [f for i, item in enumerate(obj) for f in _unknown_fields(item, schema["items"], f"{path}[{i}]")]
    return []


def _crd_errors(obj: dict[str, Any]) -> list[str]:
    validator = _crd_validator(obj["kind"])
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    return errors + [f"{f}: not in the CRD schema" for f in _unknown_fields(obj, validator.schema)]


def test_manifests_are_fresh() -> None:
    fresh = render_manifests(GENERATED.glob("*.json"), RULES_FILE)
    on_disk = {p.name: p.read_text() for p in K8S_DIR.glob("*.yaml")}
    assert on_disk == fresh, "run: llm-bench-exporter dashboards --k8s"


def test_one_configmap_per_board_byte_identical() -> None:
    boards = {p.stem: p.read_bytes() for p in GENERATED.glob("*.json")}
    maps = [o for o in _kind("ConfigMap") if o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert sorted(m["metadata"]["name"] for m in maps) == sorted(f"llmbench-dashboard-{b}" for b in boards)
    for m in maps:
        board = m["metadata"]["name"].removeprefix("llmbench-dashboard-")
        (key, text), = m["data"].items()
        assert key == f"llmbench-{board}.json"
        assert text.encode("utf-8") == boards[board]  # what the sidecar writes is the generated file
        assert json.loads(text)["uid"]


def test_prometheusrule_holds_exactly_the_rule_groups() -> None:
    rule, = _kind("PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]


@pytest.mark.slow  # promtool: a process of its own
def test_prometheusrule_groups_pass_promtool(tmp_path: Path) -> None:
    require_prometheus()
    rule, = _kind("PrometheusRule")
    groups = rule["spec"]["groups"]
    extracted = tmp_path / "extracted.rules.yml"
    extracted.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    out = subprocess.run(["promtool", "check", "rules", str(extracted)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    n_rules = sum(len(g["rules"]) for g in groups)
    assert f"{n_rules} rules found" in out.stdout


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_objects_validate_against_the_kubernetes_schemas(version: str) -> None:
    core = [o for o in _objects() if o["kind"] not in CRD_SCHEMAS]
    assert {o["kind"] for o in core} == {"ConfigMap", "PersistentVolumeClaim", "Deployment", "Service"}
    for obj in core:
        kubernetes_validate.validate(obj, version, strict=True)  # raises on any error


@pytest.mark.parametrize("kind", sorted(CRD_SCHEMAS))
def test_crds_validate_against_the_prometheus_operator_schemas(kind: str) -> None:
    objs = _kind(kind)
    assert len(objs) == 1
    _crd_validator(kind).check_schema(_crd_validator(kind).schema)
    assert _crd_errors(objs[0]) == []


def test_the_validators_catch_broken_manifests() -> None:
    """Each validator refuses a manifest broken the way a typo would break it."""
    smon, = _kind("ServiceMonitor")
    for path, value in ((("spec", "endpoints", 0, "interval"), "5 seconds"), (("spec", "selector"), None),
                        (("spec", "endpoints", 0, "intervall"), "5s")):
        bad = copy.deepcopy(smon)
        *parents, last = path
        node = bad
        for p in parents:
            node = node[p]
        if value is None:
            del node[last]
        else:
            node[last] = value
        assert _crd_errors(bad), path
    rule, = _kind("PrometheusRule")
    bad_rule = copy.deepcopy(rule)
    del bad_rule["spec"]["groups"][0]["rules"][0]["expr"]
    assert _crd_errors(bad_rule)
    deployment, = _kind("Deployment")
    for mutate in (lambda d: d["spec"]["template"]["spec"]["containers"][0].update(ports="9464"),
                   lambda d: d["spec"].update(replica=1)):
        bad_deployment = copy.deepcopy(deployment)
        mutate(bad_deployment)
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad_deployment, K8S_VERSIONS[-1], strict=True)


def test_the_pieces_fit_together() -> None:
    service, metrics = sorted(_kind("Service"), key=lambda o: o["metadata"]["name"] != MIXIN.job)
    smon, = _kind("ServiceMonitor")
    deployment, = _kind("Deployment")
    pod = deployment["spec"]["template"]
    container, = pod["spec"]["containers"]
    assert service["metadata"]["name"] == MIXIN.job  # prometheus-operator's job label: what the boards select
    labels = smon["spec"]["selector"]["matchLabels"]
    # the monitor scrapes through the metrics Service only, which names the job the boards select
    assert labels.items() <= metrics["metadata"]["labels"].items()
    assert not labels.items() <= service["metadata"]["labels"].items()
    assert metrics["metadata"]["labels"][smon["spec"]["jobLabel"]] == MIXIN.job
    for svc in (service, metrics):
        assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert svc["spec"]["ports"] == service["spec"]["ports"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    port, = service["spec"]["ports"]
    assert smon["spec"]["endpoints"][0]["port"] == port["name"] and port["targetPort"] in {
        p["name"] for p in container["ports"]}
    prom = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())["global"]
    assert smon["spec"]["endpoints"][0]["interval"] == prom["scrape_interval"]  # what the 1m rate windows assume
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    config_map = volumes["config"]["configMap"]["name"]
    claim = volumes["records"]["persistentVolumeClaim"]["claimName"]
    assert {config_map, claim} <= {o["metadata"]["name"] for o in _objects()}
    config_text = next(o for o in _kind("ConfigMap") if o["metadata"]["name"] == config_map)["data"]["exporter.yaml"]
    config = validate_config(yaml.safe_load(config_text))
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert str(config.records_dir) == mounts["records"]
    assert container["args"] == ["serve", "--config", f"{mounts['config']}/exporter.yaml"]
    assert config.listen.endswith(f":{container['ports'][0]['containerPort']}")
    assert "cpu" not in container["resources"].get("limits", {})  # CFS throttling would delay timestamps


def test_a_terminating_pod_drains_and_is_still_scraped() -> None:
    """SPEC 29: the pod's grace period holds the preStop sleep, the proxy's drain and its last scrapes
    (their config defaults) with room to exit; clients see ready pods only, the monitor every pod."""
    from exporter.proxy.config import Config

    service, metrics = sorted(_kind("Service"), key=lambda o: o["metadata"]["name"] != MIXIN.job)
    pod = _kind("Deployment")[0]["spec"]["template"]["spec"]
    container, = pod["containers"]
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    fields = Config.model_fields
    drain = fields["drain_timeout_s"].default + fields["drain_scrape_timeout_s"].default
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + 5
    assert pre_stop >= 1 and container["readinessProbe"]["periodSeconds"] <= pre_stop  # unready before SIGTERM ends
    assert metrics["spec"]["publishNotReadyAddresses"] is True and metrics["spec"]["clusterIP"] == "None"
    assert not service["spec"].get("publishNotReadyAddresses", False)


def test_dashboards_k8s_writes_the_manifests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboards_main(["--out", str(tmp_path / "boards"), "--k8s", str(tmp_path / "k8s")]) == 0
    written = {p.name: p.read_text() for p in (tmp_path / "k8s").glob("*.yaml")}
    assert written == render_manifests((tmp_path / "boards").glob("*.json"), RULES_FILE)
    assert str(tmp_path / "k8s" / "servicemonitor.yaml") in capsys.readouterr().out


@pytest.mark.parametrize("option", ["--out", "--rules", "--k8s"])
def test_unwritable_output_is_one_line_and_exit_2(tmp_path: Path, option: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = tmp_path / "boards" if option != "--out" else blocker / "sub"
    assert dashboards_main(["--out", str(out), option, str(blocker / "sub" / "x")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "cannot write" in lines[0] and str(blocker) in lines[0] and "Not a directory" in lines[0]


@pytest.mark.slow  # a subprocess: runs in the full suite
def test_unwritable_output_through_the_cli(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = subprocess.run([sys.executable, "-m", "exporter.cli", "dashboards", "--out", str(tmp_path / "boards"),
                          "--k8s", str(blocker / "k8s")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [f"llm-bench-exporter dashboards: cannot write {blocker / 'k8s'}: "
                                               "Not a directory"]


def test_k8s_dir_holds_only_manifests() -> None:
    """``kubectl apply -f deploy/kubernetes/`` applies every .yaml/.json there: only manifests live in it."""
    assert sorted(p.suffix for p in K8S_DIR.iterdir()) == [".yaml"] * len(_committed())


def test_missing_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"cannot read .*missing\.rules\.yml: No such file or directory"):
        render_manifests(GENERATED.glob("*.json"), tmp_path / "missing.rules.yml")
