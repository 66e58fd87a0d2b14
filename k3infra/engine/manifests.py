"""Kubernetes side of the in-cluster engine build: a Job on a CPU node that runs
rootless BuildKit over images/ (two passes, k3infra/engine/pod/build.sh), then writes the
pushed digest and the wheel record into a ConfigMap that Pulumi reads back.

Pure: (plan, config, names, files) -> manifest dicts. No Pulumi, no I/O.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Optional

from k3infra import checkov_skips, ephemeral, placement, podfiles
from k3infra.config import StackConfig
from k3infra.engine.plan import EnginePlan
from k3infra.netpol import default_deny, dns_egress, internet_peers, ip_peers

CONTEXT_DIR = "/k3/context"           # images/ (configmap context)
JOB_DIR = "/k3/job"                   # build.sh, report.py, build-args
OUT_DIR = "/k3/out"                   # pass 1 export + BuildKit metadata, read by report
SCCACHE_DIR = "/k3/sccache"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
AUTH_DIR = "/k3/auth"                 # registry credentials, merged for BuildKit
# The Secrets, seen only by the `auth` init container (own paths: a mount point inside a
# read-only ConfigMap volume cannot be created).
REGISTRY_AUTH_DIR = "/k3/registry-auth"
CACHE_AUTH_DIR = "/k3/cache-auth"
# The rootless BuildKit image runs as `user` (1000) with its state under this home.
BUILDKIT_UID = 1000
# The auth and report containers: small Python scripts whose only disk is their logs (the
# credentials go to a memory emptyDir, the result to the API).
SIDE_RESOURCES = ephemeral.with_storage({"requests": {"cpu": "50m", "memory": "64Mi"},
                                         "limits": {"cpu": "200m", "memory": "128Mi"}},
                                        *ephemeral.LOGS_ONLY)
BUILDKIT_HOME = "/home/user"
BUILD_ARGS_KEY = "build-args"
BUILDKITD_CONFIG_KEY = "buildkitd.toml"   # in the job ConfigMap (k3:engine.plainHttpRegistries)
JOB_SCRIPTS = ("build.sh", "report.py", "auth.py")
# Result ConfigMap keys (written by pod/report.py, read by result.parse_build_result).
RESULT_KEYS = ("digest", "image", "wheelSha256", "engineCommit", "vllmVersion")


# Where a source build connects: Git hosts, PyPI, the PyTorch index, Ubuntu mirrors
# (HTTP), the target registry, anywhere on the internet but never inside the cluster or
# link-local; the report container reaches the API server (443 on the Service, 6443 on
# most control-plane endpoints after DNAT) at k3:engine.apiServerCidrs only.
BUILD_EGRESS_PORTS = (80, 443)
API_SERVER_PORTS = (443, 6443)

@dataclass(frozen=True)
class BuildNames:
    """Object names; `build_hash` changes with anything that changes the build, so a new
    build gets new objects and an unchanged one is left alone."""

    base: str
    namespace: str
    build_hash: str

    @property
    def context_configmap(self) -> str:
        return f"{self.base}-engine-context-{self.build_hash}"

    @property
    def job_configmap(self) -> str:
        return f"{self.base}-engine-job-{self.build_hash}"

    @property
    def result_configmap(self) -> str:
        return f"{self.base}-engine-result-{self.build_hash}"

    @property
    def job(self) -> str:
        return f"{self.base}-engine-build-{self.build_hash}"

    @property
    def service_account(self) -> str:
        return f"{self.base}-engine-build"

    @property
    def role(self) -> str:
        return f"{self.base}-engine-build"

    @property
    def network_policy(self) -> str:
        return f"{self.base}-engine-build"

    @property
    def default_deny(self) -> str:
        return f"{self.base}-engine-build-default-deny"


def _digest(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:10]


def recipe_hash(plan: EnginePlan, context_files: dict[str, str]) -> str:
    """Hash of what the image is made from: build args, target ref, recipe files."""
    return _digest({"args": plan.build_args, "image": plan.tagged_ref, "context": context_files})


def build_hash(plan: EnginePlan, cfg: StackConfig, context_files: dict[str, str],
               job_files: dict[str, str]) -> str:
    """Hash of every input of an in-cluster build (recipe, job scripts, images, node)."""
    eng = cfg.engine
    material = {"recipe": recipe_hash(plan, context_files),
                "job": job_files, "source": [eng.context, eng.git_url, eng.git_revision],
                "buildkit": eng.buildkit_image, "reporter": eng.reporter_image,
                "node": [eng.build_cpu, eng.build_memory_gi, eng.build_disk_gi,
                         sorted(eng.build_node_selector.items()), eng.build_isolation,
                         eng.build_runtime_class],
                "cache": [eng.cache_registry, eng.cache_registry_secret],
                "sccache": eng.sccache_secret}
    if eng.plain_http_registries:       # only when set: unchanged builds keep their names
        material["plainHttp"] = sorted(eng.plain_http_registries)
    return _digest(material)


def buildkitd_config(cfg: StackConfig) -> Optional[str]:
    """buildkitd.toml for registries that speak plain HTTP (None: every registry has TLS)."""
    hosts = sorted(set(cfg.engine.plain_http_registries))
    if not hosts:
        return None
    return "".join(f'[registry."{host}"]\n  http = true\n' for host in hosts)


def build_args_text(plan: EnginePlan) -> str:
    """KEY=VALUE lines for build.sh (values never contain newlines: receipt strings)."""
    for key, value in plan.build_args.items():
        if "\n" in value or "=" in key:
            raise ValueError(f"build arg {key!r} cannot be passed as a line")
    return "".join(f"{k}={v}\n" for k, v in plan.build_args.items())


def _meta(name: str, names: BuildNames, labels: dict) -> dict:
    return {"name": name, "namespace": names.namespace, "labels": dict(labels)}


def build_namespace(names: BuildNames, labels: dict) -> dict:
    """The build's namespace. Pod Security `privileged`: rootless BuildKit runs with
    seccomp/AppArmor Unconfined, which `baseline` and `restricted` reject. Only the build
    Job runs here; `warn: restricted` keeps the admission warnings visible."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": names.namespace, "labels": {
                **labels, "pod-security.kubernetes.io/enforce": "privileged",
                "pod-security.kubernetes.io/warn": "restricted"}}}


def context_configmap(names: BuildNames, labels: dict, context_files: dict[str, str]) -> dict:
    return podfiles.configmap(_meta(names.context_configmap, names, labels),
                              dict(sorted(context_files.items())))


def job_configmap(names: BuildNames, labels: dict, plan: EnginePlan,
                  job_files: dict[str, str], buildkitd: Optional[str] = None) -> dict:
    extra = {BUILDKITD_CONFIG_KEY: buildkitd} if buildkitd else {}
    return podfiles.configmap(_meta(names.job_configmap, names, labels),
                              {**dict(sorted(job_files.items())),
                               BUILD_ARGS_KEY: build_args_text(plan), **extra})


def result_configmap(names: BuildNames, labels: dict, plan: EnginePlan) -> dict:
    """Created empty by Pulumi (so the Job's Role can be limited to this one name);
    the Job fills it and makes it immutable in the same patch, so its data is written
    once. Pulumi reads it back only if it is immutable and still the object it created
    (same uid): a patched or re-created ConfigMap cannot change the served digest."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {**_meta(names.result_configmap, names, labels),
                         "annotations": {"k3infra.dev/engine-image": plan.tagged_ref or ""}},
            "data": {}}


def service_account(names: BuildNames, labels: dict) -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": _meta(names.service_account, names, labels),
            "automountServiceAccountToken": False}


def role(names: BuildNames, labels: dict) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _meta(names.role, names, labels),
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                       "resourceNames": [names.result_configmap], "verbs": ["get", "patch"]}]}


def role_binding(names: BuildNames, labels: dict) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": _meta(names.role, names, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": names.role},
            "subjects": [{"kind": "ServiceAccount", "name": names.service_account,
                          "namespace": names.namespace}]}


def registry_port(repository: str | None) -> int | None:
    host = (repository or "").split("/", 1)[0]
    return int(host.rsplit(":", 1)[1]) if ":" in host else None


def _tcp(ports) -> list[dict]:
    return [{"port": p, "protocol": "TCP"} for p in ports]


def network_policy(cfg: StackConfig, plan: EnginePlan, names: BuildNames, labels: dict) -> dict:
    """The build pod: no ingress; egress DNS, the internet on the web and registry ports
    minus every cluster and link-local range (IMDS, Services, pods, nodes), the API
    server's own addresses, and a private registry's when given."""
    eng = cfg.engine
    ports = list(BUILD_EGRESS_PORTS)
    for repo in (plan.repository, plan.cache_repository):
        port = registry_port(repo)
        if port is not None and port not in ports:
            ports.append(port)
    egress = [dns_egress(cfg),
              {"to": internet_peers(["0.0.0.0/0", "::/0"], cfg), "ports": _tcp(ports)}]
    if eng.api_server_cidrs:
        egress.append({"to": ip_peers(eng.api_server_cidrs),
                       "ports": _tcp(API_SERVER_PORTS)})
    if eng.registry_cidrs:
        egress.append({"to": ip_peers(eng.registry_cidrs),
                       "ports": _tcp(ports)})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(names.network_policy, names, labels),
            "spec": {"podSelector": {"matchLabels": dict(labels)},
                     "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": egress}}


def buildkit_context(cfg: StackConfig) -> str:
    """`local` (the context ConfigMap) or a pinned remote Git context for BuildKit."""
    eng = cfg.engine
    if eng.context == "git":
        return f"{eng.git_url}#{eng.git_revision}:images"
    return "local"


def off_gpu_affinity() -> dict:
    """Builds need no GPU: keep them off GPU nodes, which the serving pods need."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": placement.GPU_PRODUCT_LABEL, "operator": "DoesNotExist"}]}]}}}


def build_job(plan: EnginePlan, cfg: StackConfig, names: BuildNames, labels: dict) -> dict:
    """The build Job: init container `build` (rootless BuildKit, both passes), then
    container `report` (writes the result ConfigMap). No retries: a failed multi-hour
    build is fixed and re-run (`pulumi up --replace`), not repeated blindly."""
    eng = cfg.engine
    context = buildkit_context(cfg)
    build_env = [
        # Rootless BuildKit in an unprivileged pod (BuildKit's own Kubernetes example).
        {"name": "BUILDKITD_FLAGS", "value": "--oci-worker-no-process-sandbox" + (
            f" --config={JOB_DIR}/{BUILDKITD_CONFIG_KEY}" if buildkitd_config(cfg) else "")},
        {"name": "DOCKER_CONFIG", "value": AUTH_DIR},
        {"name": "K3_CONTEXT", "value": context},
        {"name": "K3_IMAGE", "value": plan.tagged_ref},
        {"name": "K3_CACHE", "value": plan.cache_ref or ""},
        {"name": "K3_BUILD_ARGS_FILE", "value": f"{JOB_DIR}/{BUILD_ARGS_KEY}"},
        {"name": "K3_OUT", "value": OUT_DIR},
        {"name": "K3_SCCACHE", "value": "1" if eng.sccache_secret else "0"},
    ]
    build_mounts = [
        {"name": "job", "mountPath": JOB_DIR, "readOnly": True},
        {"name": "out", "mountPath": OUT_DIR},
        {"name": "buildkitd", "mountPath": f"{BUILDKIT_HOME}/.local/share/buildkit"},
        {"name": "auth", "mountPath": AUTH_DIR, "readOnly": True},
    ]
    volumes = [
        podfiles.volume("job", names.job_configmap, mode=0o555),
        {"name": "out", "emptyDir": {"sizeLimit": "20Gi"}},
        # BuildKit's state (layers, pass 1 cache reused by pass 2) on the node's disk.
        {"name": "buildkitd", "emptyDir": {"sizeLimit": f"{eng.build_disk_gi}Gi"}},
        {"name": "registry-auth", "secret": {
            "secretName": eng.registry_secret, "defaultMode": 0o440,
            "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}},
        {"name": "auth", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "token", "projected": {"defaultMode": 0o440, "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
            {"configMap": {"name": "kube-root-ca.crt",
                           "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}},
    ]
    if context == "local":
        build_mounts.append({"name": "context", "mountPath": CONTEXT_DIR, "readOnly": True})
        volumes.append({"name": "context", "configMap": {"name": names.context_configmap}})
    auth_sources = [f"{REGISTRY_AUTH_DIR}/config.json"]
    auth_mounts = [{"name": "job", "mountPath": JOB_DIR, "readOnly": True},
                   {"name": "registry-auth", "mountPath": REGISTRY_AUTH_DIR, "readOnly": True},
                   {"name": "auth", "mountPath": AUTH_DIR}]
    if eng.cache_registry_secret:
        volumes.append({"name": "cache-auth", "secret": {
            "secretName": eng.cache_registry_secret, "defaultMode": 0o440,
            "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}})
        auth_mounts.append({"name": "cache-auth", "mountPath": CACHE_AUTH_DIR, "readOnly": True})
        auth_sources.append(f"{CACHE_AUTH_DIR}/config.json")
    if eng.sccache_secret:
        build_mounts.append({"name": "sccache", "mountPath": SCCACHE_DIR, "readOnly": True})
        volumes.append({"name": "sccache", "secret": {"secretName": eng.sccache_secret,
                                                       "defaultMode": 0o440,
                                                       "items": [{"key": "env", "path": "env"}]}})
    mem = f"{eng.build_memory_gi}Gi"
    build = {
        "name": "build",
        "image": eng.buildkit_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", f"{JOB_DIR}/build.sh"],
        "env": build_env,
        "resources": {
            "requests": {"cpu": str(eng.build_cpu), "memory": mem,
                         "ephemeral-storage": f"{eng.build_disk_gi}Gi"},
            # The memory limit is what MAX_JOBS was sized for.
            "limits": {"cpu": str(eng.build_cpu), "memory": mem,
                       "ephemeral-storage": f"{eng.build_disk_gi + 20}Gi"},
        },
        # Rootless BuildKit creates user namespaces and mounts inside them: seccomp and
        # AppArmor must be unconfined and the setuid newuidmap needs privilege
        # escalation (BuildKit's examples/kubernetes/job.rootless.yaml). It never runs
        # as root and holds no extra capability.
        "securityContext": {
            "runAsUser": BUILDKIT_UID, "runAsGroup": BUILDKIT_UID, "runAsNonRoot": True,
            "seccompProfile": {"type": "Unconfined"},
            "appArmorProfile": {"type": "Unconfined"},
        },
        "volumeMounts": build_mounts,
    }
    restricted = {
        "runAsUser": BUILDKIT_UID, "runAsGroup": BUILDKIT_UID, "runAsNonRoot": True,
        "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    }
    auth = {
        "name": "auth",
        "image": eng.reporter_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", f"{JOB_DIR}/auth.py", AUTH_DIR, *auth_sources],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "resources": SIDE_RESOURCES,
        "securityContext": restricted,
        "volumeMounts": auth_mounts,
    }
    report = {
        "name": "report",
        "image": eng.reporter_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", f"{JOB_DIR}/report.py"],
        # A failed build's last lines (report.py prints them) become the termination
        # message, which `pulumi up`'s error shows.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": [
            {"name": "K3_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "K3_RESULT_CONFIGMAP", "value": names.result_configmap},
            {"name": "K3_REPOSITORY", "value": plan.repository},
            {"name": "K3_OUT", "value": OUT_DIR},
            {"name": "K3_TOKEN_DIR", "value": TOKEN_DIR},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        ],
        "resources": SIDE_RESOURCES,
        "securityContext": restricted,
        "volumeMounts": [
            {"name": "job", "mountPath": JOB_DIR, "readOnly": True},
            {"name": "out", "mountPath": OUT_DIR, "readOnly": True},
            {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True},
        ],
    }
    pod_spec = {
        "serviceAccountName": names.service_account,
        # Only the report container gets a token (the projected volume), not BuildKit.
        "automountServiceAccountToken": False,
        "restartPolicy": "Never",
        "securityContext": {"fsGroup": BUILDKIT_UID},
        "affinity": off_gpu_affinity(),
        "initContainers": [auth, build],
        "containers": [report],
        "volumes": volumes,
    }
    # Isolation (docs/security.md): the build's own tainted nodes, or a sandbox runtime.
    selector = dict(eng.build_node_selector)
    if eng.build_isolation == "node-pool":
        pool = placement.build_node_placement()
        selector.update(pool["nodeSelector"])
        pod_spec["tolerations"] = pool["tolerations"]
    else:
        pod_spec["runtimeClassName"] = eng.build_runtime_class
    if selector:
        pod_spec["nodeSelector"] = dict(sorted(selector.items()))
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {**_meta(names.job, names, labels),
                     "annotations": {**checkov_skips.annotations(*checkov_skips.BUILDKIT_SKIPS),
                                     "k3infra.dev/engine-image": plan.tagged_ref or "",
                                     "k3infra.dev/engine-commit": plan.engine_commit or "",
                                     "k3infra.dev/engine-version": plan.engine_version or ""}},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": eng.build_timeout_minutes * 60,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }


def build_manifests(plan: EnginePlan, cfg: StackConfig, names: BuildNames, labels: dict,
                    context_files: dict[str, str], job_files: dict[str, str]) -> dict[str, dict]:
    """Every object of an in-cluster build, keyed by role, in apply order."""
    objs = {"namespace": build_namespace(names, labels),
            "default-deny": default_deny(names.default_deny, names.namespace, labels),
            "network-policy": network_policy(cfg, plan, names, labels),
            "service-account": service_account(names, labels), "role": role(names, labels),
            "role-binding": role_binding(names, labels),
            "job-files": job_configmap(names, labels, plan, job_files, buildkitd_config(cfg)),
            "result": result_configmap(names, labels, plan)}
    if cfg.engine.context == "configmap":
        objs["context"] = context_configmap(names, labels, context_files)
    objs["job"] = build_job(plan, cfg, names, labels)
    return objs


def job_timeout_minutes(cfg: StackConfig, margin: Optional[int] = 15) -> int:
    """Pulumi's wait for the Job: the Job's own deadline plus scheduling/pull margin."""
    return cfg.engine.build_timeout_minutes + (margin or 0)
