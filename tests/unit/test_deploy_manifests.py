"""deploy/: the Kubernetes manifests cannot drift from the programs they start. Each overlay is
rendered (its kustomization lists resources only, so the union of its resources is what
`kubectl kustomize` renders), every object is read into the `kubernetes` client's model of its
kind and written back unchanged (a misspelled or misplaced field does not survive the round trip, a
missing required one raises), the LeaderWorkerSet's pod templates likewise; every radixlm
container's arguments go through radixlm's own parser and ServerArgs' checks (the LeaderWorkerSet's
$(LWS_...) variables substituted as LWS sets them), the gateway's through sglang-router's, and the
wiring holds: the gateway selects the workers' label on their port, probes read /health, a pod's
grace period outlasts the server's drain, a group's size divides its ranks. The Dockerfile's command
parses too, and its pins are the project's."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import shutil
import subprocess

import pytest
import yaml

from tests.mooncake import requires_mooncake

ROOT = pathlib.Path(__file__).resolve().parents[2] / "deploy"
OVERLAYS = sorted(p.parent for p in (ROOT / "k8s" / "overlays").glob("*/kustomization.yaml"))
MODELS = {
    "ServiceAccount": "V1ServiceAccount",
    "Role": "V1Role",
    "RoleBinding": "V1RoleBinding",
    "Deployment": "V1Deployment",
    "StatefulSet": "V1StatefulSet",
    "Service": "V1Service",
}


def render(directory: pathlib.Path) -> list[dict]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert set(kustomization) == {"resources"}, "only resources: this renderer is kustomize's then"
    docs = []
    for res in kustomization["resources"]:
        path = (directory / res).resolve()
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def round_trip(doc: dict, model: str) -> None:
    from kubernetes.client import ApiClient

    client = ApiClient()
    obj = client.deserialize(json.dumps(doc), model, "application/json")
    assert client.sanitize_for_serialization(obj) == doc, f"{doc.get('kind', model)}: fields lost"


def pod_specs(doc: dict) -> list[dict]:
    if doc["kind"] == "LeaderWorkerSet":
        lwt = doc["spec"]["leaderWorkerTemplate"]
        return [lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]]
    return [doc["spec"]["template"]["spec"]] if "template" in doc.get("spec", {}) else []


LWS_ENV = {"LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": "radixlm-0.radixlm"}


def radixlm_args(container: dict, group_size: int = 1):
    from radixlm.cli import parse_args
    from radixlm.config import ServerArgs
    from radixlm.distributed.config import DistConfig

    env = {**LWS_ENV, "LWS_GROUP_SIZE": str(group_size)}
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    args = parse_args(argv)
    # Their checks: timeouts, ranks across nodes (tp x pp divisible by the group's size), ...
    DistConfig.from_server_args(ServerArgs.from_cli_args(args))
    return args


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_overlay_renders_valid_objects_whose_commands_parse(overlay):
    from sglang_router.launch_router import parse_router_args

    docs = render(overlay)
    kinds = [d["kind"] for d in docs]
    assert "Deployment" in kinds and ("StatefulSet" in kinds or "LeaderWorkerSet" in kinds)
    gateway_args = None
    worker_pods = []
    mooncake_ports: dict[str, int] = {}
    for doc in docs:
        if doc["kind"] == "LeaderWorkerSet":
            assert doc["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
            lwt = doc["spec"]["leaderWorkerTemplate"]
            for template in (lwt["leaderTemplate"], lwt["workerTemplate"]):
                round_trip(template, "V1PodTemplateSpec")
        else:
            round_trip(doc, MODELS[doc["kind"]])
        size = (
            doc["spec"]["leaderWorkerTemplate"]["size"] if doc["kind"] == "LeaderWorkerSet" else 1
        )
        for i, spec in enumerate(pod_specs(doc)):
            for c in spec["containers"]:
                if c.get("command", [])[:3] == ["python", "-m", "sglang_router.launch_router"]:
                    gateway_args = parse_router_args(c["args"])
                    continue
                if c.get("command") == ["mooncake_master"]:
                    mooncake_ports.update(mooncake_master_ports(c["args"]))
                    continue
                assert "command" not in c and c["args"][0] == "serve", c  # the image's radixlm
                args = radixlm_args(c, size)
                leader = i == 0
                if leader:  # serves HTTP: probed there, drained within the pod's grace period
                    probe = c["readinessProbe"]["httpGet"]
                    assert probe["path"] == "/health"
                    assert spec["terminationGracePeriodSeconds"] > args.graceful_shutdown_timeout
                    worker_pods.append((doc, c, args))
    assert gateway_args is not None and gateway_args.service_discovery
    selector = gateway_args.selector  # {label: value}
    assert worker_pods
    for doc, container, args in worker_pods:
        template = (
            doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
            if doc["kind"] == "LeaderWorkerSet"
            else doc["spec"]["template"]
        )
        labels = template["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector.items()), (selector, labels)
        assert gateway_args.service_discovery_port == args.port
        assert args.port in [p["containerPort"] for p in container["ports"]]
        if args.hicache_storage_backend == "mooncake":  # the master's Service, at its ports
            env = {e["name"]: e for e in container["env"]}
            service = next(
                d for d in docs if d["kind"] == "Service" and "mooncake" in d["metadata"]["name"]
            )
            ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
            name = service["metadata"]["name"]
            assert env["MOONCAKE_MASTER"]["value"] == f"{name}:{ports['rpc']}"
            assert ports["rpc"] == mooncake_ports["rpc_port"]
            meta = f"http://{name}:{ports['metadata']}/metadata"
            assert env["MOONCAKE_TE_META_DATA_SERVER"]["value"] == meta
            assert ports["metadata"] == mooncake_ports["http_metadata_server_port"]
            assert env["RADIXLM_HICACHE_STORAGE_KEY"]["valueFrom"]["secretKeyRef"]


def mooncake_master_ports(argv: list[str]) -> dict[str, int]:
    """The ports among mooncake_master's --flag=value arguments."""
    flags = dict(a.removeprefix("--").partition("=")[::2] for a in argv)
    return {f: int(v) for f, v in flags.items() if f.endswith("port")}


@requires_mooncake
def test_mooncake_masters_flags_are_its_own():
    """Every --flag of a mooncake_master container is one the binary knows (its gflags --help)."""
    out = subprocess.run(
        [shutil.which("mooncake_master") or "mooncake_master", "--help"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    ).stdout
    known = set(re.findall(r"^\s+-(\w+) \(", out, re.M))
    assert "rpc_port" in known, out[-2000:]
    masters = [
        c
        for overlay in OVERLAYS
        for doc in render(overlay)
        for spec in pod_specs(doc)
        for c in spec["containers"]
        if c.get("command") == ["mooncake_master"]
    ]
    assert masters
    for c in masters:
        for a in c["args"]:
            flag = a.removeprefix("--").partition("=")[0]
            assert flag in known, f"mooncake_master has no --{flag}"


def test_dockerfile_command_parses_and_pins_are_the_projects():
    from radixlm.cli import parse_args

    text = (ROOT / "Dockerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (.+)$", text, re.M).group(1))
    assert entry == ["radixlm"]
    assert parse_args(cmd).command == "serve"
    pyproject = (ROOT.parent / "pyproject.toml").read_text()
    readme = (ROOT.parent / "README.md").read_text()
    pins = re.findall(r"([\w-]+==[\w.]+)", " ".join(shlex.split(text.replace("\\\n", " "))))
    assert pins
    for pin in pins:
        assert pin in pyproject or pin in readme, f"{pin}: not the project's pin"
