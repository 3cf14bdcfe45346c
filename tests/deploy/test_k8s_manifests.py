"""The container and Kubernetes files of deploy/ against the product they deploy.

The overlays are rendered with ``kubectl kustomize`` (offline) and every object is checked against the
Kubernetes 1.32 API schemas (kubernetes-validate, strict: no unknown fields). The facts they state are then
checked against the code, not against copies: the probes' paths are routes of the real app, every HYOCR_*
name is a setting and every value validates, the grace period covers the drain, the HPA's metric is one the
app exports (on the keyless metrics port the annotations point at), the dashboard is deploy/grafana's.

The Dockerfiles are parsed, not built (no Docker daemon here); their ENV, CMD, USER, EXPOSE and HEALTHCHECK
are checked against the same code, and the health check's command is run against a live server.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import kubernetes_validate
import pytest
import requests
import yaml
from packaging.requirements import Requirement
from servers import free_port

from hyocr.api.app import build_app
from hyocr.cli import build_parser
from hyocr.config import Settings, load_settings
from hyocr.engines.registry import ENGINES
from hyocr.server.uvicorn import SHUTDOWN_GRACE

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
KUBERNETES = "1.32"  # the kubectl of these machines; the schemas are kubernetes-validate's
OVERLAYS = {"cpu": K8S / "overlays" / "cpu", "gpu": K8S / "overlays" / "gpu", "monitoring": K8S / "monitoring"}
SERVING = ("cpu", "gpu")  # the overlays that run hyocr
DOCKERFILES = {"cpu": DEPLOY / "docker" / "Dockerfile.cpu", "gpu": DEPLOY / "docker" / "Dockerfile.cuda"}
IMAGE_TAGS = {"cpu": "hyocr:cpu", "gpu": "hyocr:cuda"}
ENV_NAME = re.compile(r"\bHYOCR_[A-Z0-9_]+")


# ---------------------------------------------------------------- rendering


@functools.cache
def _render(overlay: str) -> tuple[dict, ...] | str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return "kubectl is not installed: the manifests are rendered with `kubectl kustomize` (offline)"
    args = [kubectl, "kustomize", str(OVERLAYS[overlay])]
    if overlay == "monitoring":  # the dashboard file lies outside its kustomization (see its comments)
        args[2:2] = ["--load-restrictor", "LoadRestrictionsNone"]
    done = subprocess.run(args, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kubectl kustomize {overlay} failed:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def render(overlay: str) -> tuple[dict, ...]:
    docs = _render(overlay)
    if isinstance(docs, str):
        pytest.skip(docs)
    return docs


def one(docs: tuple[dict, ...], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container(docs: tuple[dict, ...]) -> dict:
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["hyocr"]
    return containers[0]


def pod_spec(docs: tuple[dict, ...]) -> dict:
    return one(docs, "Deployment")["spec"]["template"]["spec"]


def config_env(docs: tuple[dict, ...]) -> dict[str, str]:
    """The ConfigMap the container takes its environment from."""
    (ref,) = container(docs)["envFrom"]
    name = ref["configMapRef"]["name"]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    return cm["data"]


def setting(env_name: str) -> str:
    return env_name.removeprefix("HYOCR_").lower()


@pytest.fixture
def env_settings(monkeypatch):
    """Settings as the server would load them from exactly these HYOCR_* variables (plus overrides); the
    other variables given (an image's HOME, PYTHON*) are left out of this process."""

    def load(env: dict[str, str], **overrides) -> Settings:
        for name in [n for n in os.environ if n.startswith("HYOCR_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            if name.startswith("HYOCR_"):
                monkeypatch.setenv(name, value)
        return load_settings(**overrides)

    return load


@functools.cache
def app_routes() -> frozenset[str]:
    app = build_app(load_settings(engine="fake", ui=False, jobs=False))
    return frozenset(getattr(route, "path", "") for route in app.routes)


# ---------------------------------------------------------------- the manifests are valid Kubernetes objects


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_every_object_validates_against_the_api_schemas(overlay):
    docs = render(overlay)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises ValidationError with the field
    kinds = sorted(d["kind"] for d in docs)
    if overlay in SERVING:
        assert kinds == ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"]
    else:
        assert kinds == ["ConfigMap", "ConfigMap"]


@pytest.mark.parametrize("overlay", SERVING)
def test_selectors_match_the_pods(overlay):
    docs = render(overlay)
    labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selectors = [one(docs, "Deployment")["spec"]["selector"]["matchLabels"],
                 one(docs, "Service")["spec"]["selector"],
                 one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]]
    for term in pod_spec(docs)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]:
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        selectors.append(term["podAffinityTerm"]["labelSelector"]["matchLabels"])
    for selector in selectors:
        assert selector.items() <= labels.items()
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == one(docs, "Deployment")["metadata"]["name"]
    assert "replicas" not in one(docs, "Deployment")["spec"], "the HPA owns the replica count"
    assert hpa["spec"]["minReplicas"] >= 2
    service_ports = {p["targetPort"] for p in one(docs, "Service")["spec"]["ports"]}
    assert service_ports == {"http"}, "the keyless metrics port stays off the Service"


# ---------------------------------------------------------------- the manifests against the product


@pytest.mark.parametrize("overlay", SERVING)
def test_probes_are_routes_of_the_app(overlay):
    c = container(render(overlay))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    paths = {}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["port"] in ports, f"{probe} names a port the container does not declare"
        assert get["path"] in app_routes(), f"{probe}: {get['path']} is no route of the app"
        paths[probe] = get["path"]
    assert paths == {"startupProbe": "/ready", "readinessProbe": "/ready", "livenessProbe": "/health"}
    assert ports["http"] == Settings.model_fields["port"].default  # the Dockerfiles do not change it


@pytest.mark.parametrize("overlay", SERVING)
def test_env_names_are_settings_and_values_validate(overlay, env_settings):
    docs = render(overlay)
    env = config_env(docs)
    names = set(env) | {e["name"] for e in container(docs)["env"]}
    for name in names:
        if name.startswith("HYOCR_"):
            assert setting(name) in Settings.model_fields, f"{name} is not a setting"
    for e in container(docs)["env"]:  # secrets: referenced, never given, never required
        ref = e["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"], ref["optional"]) == ("hyocr-secrets", e["name"], True)
    assert not [d for d in docs if d["kind"] == "Secret"]
    # What the pod's server would load: the image's ENV beneath the ConfigMap.
    settings = env_settings({**dockerfile_env(DOCKERFILES[overlay]), **env})
    assert settings.engine == {"cpu": "rapidocr", "gpu": "vllm"}[overlay]
    assert settings.engine in ENGINES
    assert settings.host == "0.0.0.0"
    assert settings.ui is False  # Gradio's sessions would be split between replicas


def test_every_hyocr_name_written_in_deploy_is_a_setting():
    """Comments included: a placeholder to uncomment must name a real setting too."""
    files = [p for p in (*K8S.rglob("*"), *(DEPLOY / "docker").rglob("*"), REPO / ".dockerignore") if p.is_file()]
    assert len(files) >= 15
    for path in files:
        for name in set(ENV_NAME.findall(path.read_text())):
            assert setting(name) in Settings.model_fields, f"{path.relative_to(REPO)}: {name} is not a setting"


def test_the_commented_placeholders_validate(env_settings):
    """The shared-state lines of base/config.env, once uncommented, are settings hyocr accepts."""
    placeholders = {}
    for line in (K8S / "base" / "config.env").read_text().splitlines():
        if m := re.fullmatch(r"# (HYOCR_[A-Z_]+)=(\S+)", line):
            placeholders[m[1]] = m[2]
    assert {"HYOCR_RATE_LIMIT_STORAGE", "HYOCR_JOBS_DATABASE_URL"} <= set(placeholders)
    settings = env_settings(placeholders)
    assert "hyocr-redis" in settings.rate_limit_storage
    assert settings.jobs_database_url.startswith("postgresql+asyncpg://hyocr@hyocr-postgres")


@pytest.mark.parametrize("overlay", SERVING)
def test_termination_grace_covers_the_drain(overlay, env_settings):
    docs = render(overlay)
    drain = env_settings({**dockerfile_env(DOCKERFILES[overlay]), **config_env(docs)}).drain_timeout
    command = container(docs)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2
    sleep = float(command[1])
    assert 0 < sleep <= 15
    grace = pod_spec(docs)["terminationGracePeriodSeconds"]
    # The preStop hook runs inside the grace period; then the drain, then uvicorn's own cancellation.
    assert grace > sleep + drain + SHUTDOWN_GRACE, (grace, sleep, drain, SHUTDOWN_GRACE)


def test_gpu_startup_probe_outlasts_a_cold_vllm_start():
    probe = container(render("gpu"))["startupProbe"]
    window = probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"]
    assert window >= 600  # ~140 s cold start on an H200 plus weight loading
    assert container(render("cpu"))["startupProbe"]["httpGet"]["path"] == "/ready"


@pytest.mark.parametrize("overlay", SERVING)
def test_resources_images_and_volumes(overlay, env_settings):
    docs = render(overlay)
    c = container(docs)
    assert c["image"] == IMAGE_TAGS[overlay]
    resources = c["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    settings = env_settings({**dockerfile_env(DOCKERFILES[overlay]), **config_env(docs)})
    # The root filesystem is read-only: the data folder, /tmp and the image's HOME are emptyDirs.
    for path in (str(settings.data_path), "/tmp", dockerfile_env(DOCKERFILES[overlay])["HOME"]):
        assert "emptyDir" in volumes[mounts[path]["name"]], path
    if overlay == "cpu":
        assert "cpu" in resources["limits"]
        assert "nvidia.com/gpu" not in resources["limits"]
    else:
        assert resources["limits"]["nvidia.com/gpu"] == 1
        models = mounts["/models"]
        assert models["readOnly"] is True
        claim = volumes[models["name"]]["persistentVolumeClaim"]
        assert claim == {"claimName": "hyocr-models", "readOnly": True}
        assert settings.model.startswith("/models/")
        assert settings.model == dockerfile_env(DOCKERFILES[overlay])["HYOCR_MODEL"]
        assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize("overlay", SERVING)
def test_security_context(overlay):
    docs = render(overlay)
    pod, c = pod_spec(docs)["securityContext"], container(docs)["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert c["readOnlyRootFilesystem"] is True
    assert c["allowPrivilegeEscalation"] is False
    assert c["capabilities"]["drop"] == ["ALL"]
    # The image's numeric USER is the pod's uid (runAsNonRoot checks a number).
    uid, _, gid = dockerfile(DOCKERFILES[overlay])["USER"][-1].partition(":")
    assert (pod["runAsUser"], pod["runAsGroup"]) == (int(uid), int(gid)) and int(uid) != 0


@pytest.mark.parametrize("overlay", SERVING)
def test_scrape_annotations_point_at_the_metrics_port(overlay, env_settings):
    docs = render(overlay)
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    ports = {p["name"]: p["containerPort"] for p in container(docs)["ports"]}
    settings = env_settings(config_env(docs))
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics" and "/metrics" in app_routes()
    assert int(annotations["prometheus.io/port"]) == ports["metrics"] == settings.metrics_port
    assert settings.metrics_port != settings.port


def test_hpa_metrics():
    for overlay in SERVING:
        hpa = one(render(overlay), "HorizontalPodAutoscaler")
        assert hpa["apiVersion"] == "autoscaling/v2"
        pods = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
        assert [p["metric"]["name"] for p in pods] == ["hyocr_queue_length"]
        assert pods[0]["target"]["type"] == "AverageValue"
        resources = {m["resource"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Resource"}
        assert resources == ({"cpu"} if overlay == "cpu" else set())


def test_the_configured_server_serves_what_the_manifests_use(fake_server_factory, env_settings, tmp_path):
    """The cpu overlay's settings on a live server (fake engine, API keys on): the probes answer without
    credentials, the API port's /metrics wants a key, the metrics port serves the HPA's metric without one."""
    docs = render("cpu")
    metrics_port = free_port()
    env = {**config_env(docs), "HYOCR_METRICS_PORT": str(metrics_port)}
    env_settings(env)  # the environment the server below loads its settings from
    server = fake_server_factory(engine="fake", api_keys="k-deploy", data_dir=str(tmp_path), metrics_host="127.0.0.1")
    c = container(docs)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert requests.get(server.url + c[probe]["httpGet"]["path"], timeout=10).status_code == 200, probe
    assert requests.get(f"{server.url}/metrics", timeout=10).status_code == 401
    scraped = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
    assert scraped.status_code == 200
    exported = {line.split()[2] for line in scraped.text.splitlines() if line.startswith("# TYPE ")}
    for overlay in SERVING:
        for metric in one(render(overlay), "HorizontalPodAutoscaler")["spec"]["metrics"]:
            if metric["type"] == "Pods":
                assert metric["pods"]["metric"]["name"] in exported
    rules = yaml.safe_load(_adapter_rules()["data"]["config.yaml"])["rules"]
    (rule,) = rules
    assert rule["name"]["as"] == "hyocr_queue_length" and "hyocr_queue_length" in exported
    assert rule["seriesQuery"].split("{")[0] in exported


def _adapter_rules() -> dict:
    (cm,) = [d for d in render("monitoring") if d["metadata"]["name"] == "hyocr-prometheus-adapter-rules"]
    return cm


def test_dashboard_configmap_is_the_dashboard():
    (cm,) = [d for d in render("monitoring") if d["metadata"]["name"] == "hyocr-grafana-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"] == {"hyocr.json": (DEPLOY / "grafana" / "hyocr.json").read_text()}
    json.loads(cm["data"]["hyocr.json"])


# ---------------------------------------------------------------- Dockerfiles (parsed; not built here)

INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
                "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


@functools.cache
def _instructions(path: Path) -> tuple[tuple[str, str], ...]:
    """(INSTRUCTION, arguments) in order: continuation lines joined, comments and blank lines dropped."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):  # a comment inside a continued instruction is dropped too
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, args = line.partition(" ")
        out.append((word, args.strip()))
    assert not pending, f"{path.name} ends inside a continued line"
    return tuple(out)


def dockerfile(path: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for word, args in _instructions(path):
        found.setdefault(word, []).append(args)
    return found


def dockerfile_env(path: Path) -> dict[str, str]:
    env = {}
    for args in dockerfile(path).get("ENV", []):
        for pair in shlex.split(args):
            name, sep, value = pair.partition("=")
            assert sep, f"ENV {args!r}: use NAME=value"
            env[name] = value
    return env


def healthcheck_command(path: Path) -> str:
    (args,) = dockerfile(path)["HEALTHCHECK"]
    options, sep, command = args.partition(" CMD ")
    assert sep and all(o.startswith("--") for o in options.split()), args
    return command


@pytest.mark.parametrize("target", list(DOCKERFILES))
def test_dockerfile_structure(target):
    path = DOCKERFILES[target]
    instructions = _instructions(path)
    for word, args in instructions:
        assert word in INSTRUCTIONS, f"{path.name}: unknown instruction {word!r}"
        assert args or word == "ENTRYPOINT", f"{path.name}: {word} without arguments"
    assert instructions[0][0] == "FROM"
    found = dockerfile(path)
    assert json.loads(found["CMD"][-1]) == ["hyocr", "serve"]
    assert found["STOPSIGNAL"] == ["SIGTERM"]
    env = dockerfile_env(path)
    assert found["EXPOSE"] == [env["HYOCR_PORT"]] == [str(Settings.model_fields["port"].default)]
    assert "/health" in healthcheck_command(path) and "/health" in app_routes()
    assert "curl" not in healthcheck_command(path)
    for run in found["RUN"]:
        assert "--no-deps" not in run
    if target == "gpu":
        (base,) = found["FROM"]
        assert base == "vllm/vllm-openai:v0.26.0"
        assert json.loads(found["ENTRYPOINT"][-1]) == []
        vllm_extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
        assert Requirement(vllm_extra[0]).specifier.contains(base.rpartition(":v")[2]), "base's vLLM unsupported"
        assert env["HF_HUB_OFFLINE"] == "1"
        assert env["HYOCR_MODEL"].startswith("/models/")  # the gpu overlay's read-only volume
    else:
        assert found["FROM"] == ["python:3.11-slim"]


@pytest.mark.parametrize("target", list(DOCKERFILES))
def test_the_healthcheck_command_passes_against_a_live_server(target, fake_server_factory):
    """The HEALTHCHECK's python one-liner, run here (python and python3 from this venv): 0 against a
    serving port, non-zero against a closed one."""
    check = healthcheck_command(DOCKERFILES[target])  # shell form: Docker runs it with /bin/sh -c
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    server = fake_server_factory(ui=False)
    for port, passes in ((server.port, True), (free_port(), False)):
        done = subprocess.run(["/bin/sh", "-c", check], env={**os.environ, "PATH": path, "HYOCR_PORT": str(port)},
                              capture_output=True, timeout=30, check=False)
        assert (done.returncode == 0) == passes, done.stderr


def test_dockerfile_cmd_and_env_name_the_product(env_settings):
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    for target, path in DOCKERFILES.items():
        program, subcommand = json.loads(dockerfile(path)["CMD"][-1])
        assert program in pyproject["project"]["scripts"]
        assert subcommand in commands
        env = dockerfile_env(path)
        for name in env:
            if name.startswith("HYOCR_"):
                assert setting(name) in Settings.model_fields, f"{path.name}: {name} is not a setting"
        settings = env_settings(env)
        assert settings.engine == {"cpu": "rapidocr", "gpu": "vllm"}[target]
        assert (settings.host, settings.log_format, settings.data_dir) == ("0.0.0.0", "json", "/data")


def test_the_build_context_holds_what_the_dockerfiles_copy():
    """/.dockerignore (an allowlist; the last matching line wins, as in Docker) lets through every COPY
    source, and those exist."""
    rules = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]

    def excluded(path: str) -> bool:
        verdict = False
        for rule in rules:
            negated, pattern = rule.startswith("!"), rule.lstrip("!").rstrip("/")
            if fnmatch(path, pattern) or fnmatch(path, pattern.removeprefix("**/")):
                verdict = not negated
        return verdict

    for path in DOCKERFILES.values():
        for args in dockerfile(path)["COPY"]:
            *sources, _ = shlex.split(args)
            for source in sources:
                assert not source.startswith("--"), "no COPY options expected"
                assert (REPO / source).exists(), source
                assert not excluded(source), f"{source} is excluded by /.dockerignore"
    for heavy in (".venv", ".git", "test-artifacts", ".stage", "benchmarks", "tests"):
        assert excluded(heavy), heavy
