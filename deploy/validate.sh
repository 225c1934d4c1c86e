#!/usr/bin/env bash
# Checks what this repository can check without a container engine or a cluster: every
# YAML file parses, the Kubernetes objects have their required fields, the KEDA
# ScaledObjects scale the Deployment and the JetStream trigger names the stream and
# consumer the ConfigMap gives the workers, the compose file's services are complete, the
# dashboard is valid JSON whose panels have distinct ids and places and whose queries name
# only metrics the worker exports; and yamllint passes, where it is installed.
set -euo pipefail
cd "$(dirname "$0")"
python3 - <<'PY'
import json, re, sys, pathlib, yaml
failures = []
k8s = []
for path in sorted(pathlib.Path(".").rglob("*.yaml")):
    for doc in yaml.safe_load_all(path.read_text()):
        if path.parts[0] == "k8s":
            k8s.append((path, doc))
            for field in ("apiVersion", "kind", "metadata", ("spec" if doc.get("kind") not in ("ConfigMap", "Secret") else "kind")):
                if field not in doc:
                    failures.append(f"{path}: no {field}")
        if path.name == "compose.yaml":
            for name, service in doc["services"].items():
                if "image" not in service and "build" not in service:
                    failures.append(f"{path}: service {name} has neither image nor build")
deployments = {doc["metadata"]["name"] for _, doc in k8s if doc.get("kind") == "Deployment"}
config = next((doc["data"] for _, doc in k8s if doc.get("kind") == "ConfigMap"), {})
# What each worker is told: the names the job queue's trigger must read.
queue = {"stream": config.get("JETSTREAM_STREAM"), "consumer": config.get("JETSTREAM_CONSUMER")}
for path, doc in k8s:
    if doc.get("kind") != "ScaledObject":
        continue
    spec = doc.get("spec", {})
    if spec.get("scaleTargetRef", {}).get("name") not in deployments:
        failures.append(f"{path}: scaleTargetRef names no Deployment in k8s/")
    if not spec.get("triggers"):
        failures.append(f"{path}: no triggers")
    for trigger in spec.get("triggers") or []:
        if trigger.get("type") != "nats-jetstream":
            continue
        meta = trigger.get("metadata", {})
        for key in ("natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold"):
            if key not in meta:
                failures.append(f"{path}: nats-jetstream trigger has no {key}")
        for key, expected in queue.items():
            if key in meta and meta[key] != expected:
                failures.append(f"{path}: nats-jetstream {key} {meta[key]!r}, the ConfigMap says {expected!r}")
dashboard = json.loads(pathlib.Path("grafana-dashboard.json").read_text())
ids = [panel["id"] for panel in dashboard["panels"]]
if len(ids) != len(set(ids)):
    failures.append("dashboard: panel ids repeat")
cells = {}
for panel in dashboard["panels"]:
    g = panel["gridPos"]
    taken = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
    others = {cells[cell] for cell in taken if cell in cells}
    for other in sorted(others):
        failures.append(f"dashboard panel {panel['title']!r} overlaps {other!r}")
    cells.update(dict.fromkeys(taken, panel["title"]))
exported = set(re.findall(r'r\.register\(\s*"([a-z_]+)"', pathlib.Path("../src/metrics.rs").read_text()))
for panel in dashboard["panels"]:
    for target in panel["targets"]:
        for metric in re.findall(r"summarizer_([a-z_]+?)(?:_total|_bucket|_count|_sum)?\b", target["expr"]):
            if metric not in exported:
                failures.append(f"dashboard panel {panel['title']!r}: unknown metric summarizer_{metric}")
if failures:
    print("\n".join(failures)); sys.exit(1)
print("deploy/: YAML parses, Kubernetes objects and compose services complete, ScaledObjects match the "
      "Deployment and ConfigMap, dashboard panels distinct and their metrics exist")
PY
if command -v yamllint >/dev/null; then
  yamllint --strict -d '{extends: relaxed, rules: {line-length: {max: 120}}}' .
  echo "deploy/: yamllint (relaxed, 120 columns) passes"
else
  echo "deploy/: yamllint not installed, skipped"
fi
