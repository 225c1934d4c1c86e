#!/usr/bin/env bash
# Checks what this repository can check without a container engine or a cluster: every
# YAML file parses, the Kubernetes objects have their required fields, the compose file's
# services are complete, the dashboard is valid JSON whose queries name only metrics the
# worker exports.
set -euo pipefail
cd "$(dirname "$0")"
python3 - <<'PY'
import json, re, sys, pathlib, yaml
failures = []
for path in sorted(pathlib.Path(".").rglob("*.yaml")):
    for doc in yaml.safe_load_all(path.read_text()):
        if path.parts[0] == "k8s":
            for field in ("apiVersion", "kind", "metadata", ("spec" if doc.get("kind") not in ("ConfigMap", "Secret") else "kind")):
                if field not in doc:
                    failures.append(f"{path}: no {field}")
        if path.name == "compose.yaml":
            for name, service in doc["services"].items():
                if "image" not in service and "build" not in service:
                    failures.append(f"{path}: service {name} has neither image nor build")
dashboard = json.loads(pathlib.Path("grafana-dashboard.json").read_text())
exported = set(re.findall(r'r\.register\(\s*"([a-z_]+)"', pathlib.Path("../src/metrics.rs").read_text()))
for panel in dashboard["panels"]:
    for target in panel["targets"]:
        for metric in re.findall(r"summarizer_([a-z_]+?)(?:_total|_bucket|_count|_sum)?\b", target["expr"]):
            if metric not in exported:
                failures.append(f"dashboard panel {panel['title']!r}: unknown metric summarizer_{metric}")
if failures:
    print("\n".join(failures)); sys.exit(1)
print("deploy/: YAML parses, Kubernetes objects and compose services complete, dashboard metrics exist")
PY
