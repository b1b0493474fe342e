"""deploy/: the Helm chart rendered by Helm's own engine (helm-python-sdk binds Helm's Go SDK), every
manifest validated against the Kubernetes schemas (kubernetes-validate ships them: offline), the
ServiceMonitor and PrometheusRule against models generated from the Prometheus Operator's CRDs
(cloudcoil-models-prometheus-operator), the PrometheusRule's rules by promtool, the plain manifests and the rules file kept equal to what they are
generated from, and the agent command lines of the DaemonSet, the image and the systemd unit run for
real (with the fake backend in place of NVML)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from testlib import free_port, import_or_skip, wait_http, which_or_skip

import_or_skip("helm_python", "rendering the chart needs helm-python-sdk (the dev extra)")
kubernetes_validate = import_or_skip("kubernetes_validate", "the schemas come with kubernetes-validate (the dev extra)")
operator_models = import_or_skip("cloudcoil.models.prometheus_operator.v1",
                                 "the Prometheus Operator's CRD models (cloudcoil-models-prometheus-operator, the dev extra)")

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
sys.path.insert(0, str(DEPLOY))
import render_manifests  # noqa: E402

K8S_VERSION = "1.30.0"  # the oldest Kubernetes the chart claims (pod-resources v1 and DaemonSet apps/v1 are older)
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
VARIANTS = {
    "defaults": {},
    "dcgm-names, store on the host, nvidia runtime": {"metricNames": "dcgm", "store": {"hostPath": "/var/lib/gpulens"},
                                                      "runtimeClassName": "nvidia", "hostPID": True},
    "no pod attribution, no operator, no ingest socket": {"podResources": {"enabled": False}, "serviceMonitor": {"enabled": False},
                                                         "ingest": {"enabled": False},
                                        "prometheusRule": {"enabled": False}},
    "what an admin sets": {
        "priorityClassName": "system-node-critical", "podDisruptionBudget": {"enabled": True},
        "podAnnotations": {"example.com/team": "ml-platform"}, "podLabels": {"team": "ml"},
        "extraArgs": ["--keep-raw", "3d"], "extraEnv": [{"name": "TZ", "value": "UTC"}],
        "extraVolumes": [{"name": "scratch", "emptyDir": {}}], "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "imagePullSecrets": [{"name": "registry"}], "listenHost": "[::]",
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "Exists"}]}]}}},
        "webConfig": {"existingSecret": "gpulens-web", "tls": True},
        "serviceMonitor": {"scrapeTimeout": "10s", "relabelings": [
            {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}],
            "metricRelabelings": [{"sourceLabels": ["__name__"], "regex": "gpu_process_.*", "action": "drop"}],
            "tlsConfig": {"ca": {"secret": {"name": "gpulens-ca", "key": "ca.crt"}}, "serverName": "gpulens"},
            "basicAuth": {"username": {"name": "scrape", "key": "user"}, "password": {"name": "scrape", "key": "password"}}},
    },
    "OTLP to a Collector, auth from a Secret": {"otlp": {"endpoint": "http://otel-collector.observability:4318/v1/metrics",
                                                        "headers": [{"name": "Authorization", "secretName": "otlp-auth",
                                                                     "secretKey": "authorization"}]}},
    "operator selector labels": {"serviceMonitor": {"labels": {"release": "kube-prometheus-stack"}},
                                 "prometheusRule": {"labels": {"release": "kube-prometheus-stack"}}},
}


def validate_crd(doc: dict) -> None:
    """A Prometheus Operator object against its CRD's model. The models ignore unknown fields, so the
    object must also come back unchanged from a round trip: a misspelled field would be dropped."""
    model = getattr(operator_models, doc["kind"]).model_validate(doc)
    assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc, f"{doc['kind']} has fields its CRD does not"


def _docs(rendered: dict[str, str]) -> list[dict]:
    return [d for text in rendered.values() for d in yaml.safe_load_all(text) if d]


def test_chart_lints_clean():
    from helm_python.chart import lint

    report = lint(render_manifests.CHART, strict=True, kube_version=f"v{K8S_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report.get("errors", [])
    assert problems == []


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_rendered_manifest_is_valid(variant, tmp_path):
    docs = _docs(render_manifests.render(VARIANTS[variant]))
    kinds = sorted(d["kind"] for d in docs)
    for d in docs:
        if (d["apiVersion"], d["kind"]) in CRD_KINDS:
            validate_crd(d)  # not in the Kubernetes schemas: the operator's own
            continue
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)  # raises ValidationError naming the field
    by_kind = {d["kind"]: d for d in docs}
    ds = by_kind["DaemonSet"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    if "ServiceMonitor" in by_kind:
        sm, svc = by_kind["ServiceMonitor"], by_kind["Service"]
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    if "PrometheusRule" in by_kind:
        rules = tmp_path / "rules.yml"
        rules.write_text(yaml.safe_dump(by_kind["PrometheusRule"]["spec"]))
        done = subprocess.run([which_or_skip("promtool"), "check", "rules", str(rules)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    if variant == "no pod attribution, no operator":
        assert kinds == ["DaemonSet", "Service"]
        assert "--pod-resources" not in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert (c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]) == ("/health", "/ready")
    if variant == "defaults":
        assert "priorityClassName" not in pod and "PodDisruptionBudget" not in kinds  # why: values.yaml
    if variant == "what an admin sets":
        assert kinds == ["DaemonSet", "PodDisruptionBudget", "PrometheusRule", "Service", "ServiceMonitor"]
        assert pod["priorityClassName"] == "system-node-critical" and pod["imagePullSecrets"] == [{"name": "registry"}]
        assert "nodeAffinity" in pod["affinity"] and ds["spec"]["template"]["metadata"]["annotations"] == {"example.com/team": "ml-platform"}
        assert c["args"][-4:] == ["--web-config", "/etc/gpulens/web/web.yml", "--keep-raw", "3d"] and "[::]:9464" in c["args"]
        assert {"name": "TZ", "value": "UTC"} in c["env"] and c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
        assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/etc/gpulens/web", "/scratch"}
        assert {v["name"] for v in pod["volumes"]} >= {"web-config", "scratch"}
        ep = by_kind["ServiceMonitor"]["spec"]["endpoints"][0]
        assert ep["scheme"] == "https" and ep["scrapeTimeout"] == "10s" and ep["relabelings"][0]["targetLabel"] == "node"
        assert ep["basicAuth"]["username"]["name"] == "scrape" and ep["tlsConfig"]["serverName"] == "gpulens"
        assert by_kind["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1


def test_a_bad_value_is_caught_by_the_schemas():
    """The validation can fail: a misspelled toleration field (strict), a container port that is not a
    number (set in the rendered object: the chart's own values schema would refuse it earlier)."""
    ds = next(d for d in _docs(render_manifests.render({"tolerations": [{"key": "x", "operater": "Exists"}]}))
              if d["kind"] == "DaemonSet")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)
    ds = next(d for d in _docs(render_manifests.render()) if d["kind"] == "DaemonSet")
    ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("values", "where"), [({"metricNames": "prom"}, "/metricNames"), ({"port": 70000}, "/port"),
                                               ({"interval": "fast"}, "/interval"),
                                               ({"extraArgs": [3]}, "/extraArgs"),
                                               ({"serviceMonitor": {"scrapeTimeout": "soon"}}, "/serviceMonitor/scrapeTimeout"),
                                               ({"otlp": {"endpoint": "collector:4318"}}, "/otlp/endpoint")])
def test_the_charts_values_schema_names_the_bad_value(values, where):
    from helm_python.errors import HelmValuesError

    with pytest.raises(HelmValuesError, match=where):
        render_manifests.render(values)


def test_a_bad_operator_object_is_caught():
    sm = next(d for d in _docs(render_manifests.render()) if d["kind"] == "ServiceMonitor")
    typo = {**sm, "spec": {**sm["spec"], "endpoints": [{"portt": "metrics"}]}}
    with pytest.raises(AssertionError, match="fields its CRD does not"):
        validate_crd(typo)
    with pytest.raises(ValueError):  # pydantic's ValidationError: an interval that is not a duration
        validate_crd(next(d for d in _docs(render_manifests.render({"serviceMonitor": {"interval": "often"}}))
                          if d["kind"] == "ServiceMonitor"))


def test_otlp_is_off_by_default_and_its_header_values_come_from_a_secret():
    """otlp.endpoint adds --otlp; each header's value is the kubelet's expansion of a variable filled from a
    Secret, so no token is written into the pod spec."""
    def agent(values: dict) -> dict:
        ds = next(d for d in _docs(render_manifests.render(values)) if d["kind"] == "DaemonSet")
        return ds["spec"]["template"]["spec"]["containers"][0]

    assert not any(a.startswith("--otlp") for a in agent({})["args"])
    url = "http://otel-collector.observability:4318/v1/metrics"
    c = agent({"otlp": {"endpoint": url, "interval": "30s",
                        "headers": [{"name": "Authorization", "secretName": "otlp-auth", "secretKey": "authorization"}]}})
    args = c["args"]
    assert args[args.index("--otlp") + 1] == url and args[args.index("--otlp-interval") + 1] == "30s"
    assert args[args.index("--otlp-header") + 1] == "Authorization=$(GPULENS_OTLP_HEADER_0)"
    env = {e["name"]: e for e in c["env"]}
    assert env["GPULENS_OTLP_HEADER_0"]["valueFrom"] == {"secretKeyRef": {"name": "otlp-auth", "key": "authorization"}}


def test_plain_manifests_are_the_chart_rendered():
    committed = (DEPLOY / "kubernetes" / "gpulens.yaml").read_text()
    assert committed == render_manifests.manifests_text(render_manifests.render()), \
        "deploy/kubernetes/gpulens.yaml is stale: run python deploy/render_manifests.py"


def test_the_prometheus_rule_is_the_exported_rules(tmp_path):
    out = tmp_path / "rules.yml"
    # from an empty folder: a .gpulens/gpulens.db left by `make run` would add its learned rules
    subprocess.run([sys.executable, "-m", "gpulens.cli.main", "alerts", "export", "--format", "prometheus", "--out", str(out)],
                   check=True, capture_output=True, timeout=120, cwd=tmp_path)
    assert (DEPLOY / "helm" / "gpulens" / "files" / "gpulens-rules.yml").read_text() == out.read_text(), \
        "the chart's rules are stale: gpulens alerts export --format prometheus --out deploy/helm/gpulens/files/gpulens-rules.yml"


def _run_agent(args: list[str], tmp_path: Path, *, port: int, extra_env: dict | None = None) -> str:
    """Run `gpulens <args>` (with NVML swapped for the fake backend) until a scrape shows its first
    sample (the server is up a moment before the first sample lands); return that scrape."""
    cmd = [sys.executable, "-m", "gpulens.cli.main", *[a.replace("nvml", "fake:2") for a in args], "--duration", "30s"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env={**os.environ, **(extra_env or {})})
    try:
        # a loaded CI machine takes seconds to import and start
        return wait_http(f"http://127.0.0.1:{port}/metrics", proc, 45, log=lambda: proc.communicate()[0], interval=0.1,
                         until=lambda body: b"gpu_up{" in body, what=str(cmd)).decode()
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_daemonsets_command_line_runs(kubelet, tmp_path):
    kubelet.pods = [kubelet.pod("ml", "trainer-0", {"main": {"nvidia.com/gpu": ["GPU-fake-0000-0000"]}})]
    port = free_port()
    ds = next(d for d in _docs(render_manifests.render({"port": port})) if d["kind"] == "DaemonSet")
    c = ds["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    args = [a.replace(f"0.0.0.0:{port}", f"127.0.0.1:{port}") for a in c["args"]]
    # the downward API as the kubelet fills it: the node's name, the agent's host label by default
    env = {e["name"]: "gpu-node-7" for e in c["env"] if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName"}
    assert env == {"GPULENS_HOST": "gpu-node-7"}
    # the paths the pod mounts, moved under tmp_path (the kubelet socket: the test's kubelet)
    # the ingest socket on its hostPath mount, for workload pods' GPULENS_AGENT (a socket path must stay short)
    assert "unix:/run/gpulens/ingest.sock" in args and "/run/gpulens" in mounts
    ingest = tempfile.mkdtemp(prefix="gl-", dir="/tmp")
    args = [str(tmp_path / "store.db") if a == "/var/lib/gpulens/gpulens.db" else kubelet.socket if a.endswith("kubelet.sock")
            else f"unix:{ingest}/ingest.sock" if a == "unix:/run/gpulens/ingest.sock" else a
            for a in args]
    assert "/var/lib/gpulens" in mounts and "/var/lib/kubelet/pod-resources" in mounts
    try:
        text = _run_agent(args, tmp_path, port=port, extra_env=env)
    finally:
        shutil.rmtree(ingest, ignore_errors=True)
    assert re.search(r'gpu_up\{[^}]*host="gpu-node-7"[^}]*pod="trainer-0"', text), text[:2000]


def test_the_images_command_line_runs(tmp_path):
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1))
    assert entry == ["gpulens"] and re.search(r"^EXPOSE 9464$", dockerfile, re.M)
    port = free_port()
    args = [str(tmp_path / "s.db") if a.startswith("/var/lib/gpulens") else a.replace("0.0.0.0:9464", f"127.0.0.1:{port}") for a in cmd]
    assert "gpu_up{" in _run_agent(args, tmp_path, port=port)


def test_the_systemd_unit_verifies_and_its_command_line_runs(tmp_path):
    analyze = shutil.which("systemd-analyze")
    unit = (DEPLOY / "systemd" / "gpulens-agent.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1).split()
    assert exec_start[0] == "/usr/local/bin/gpulens"
    if analyze:
        local = tmp_path / "gpulens-agent.service"
        local.write_text(unit.replace("/usr/local/bin/gpulens", str(Path(sys.executable).with_name("gpulens"))))
        done = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "gpulens-agent.service" not in done.stderr, done.stderr
    port = free_port()
    args = [str(tmp_path / "s.db") if a.startswith("/var/lib/gpulens") else a.replace("0.0.0.0:9464", f"127.0.0.1:{port}")
            for a in exec_start[1:]]
    assert "gpu_up{" in _run_agent(args, tmp_path, port=port)
