"""Reading a live cluster for `k3infra verify` and `k3infra bench fetch` through the
`kubernetes` Python client and the user's kubeconfig. Thin: find objects, read a file
in the serving pod, run the results reader pod; every decision is in drift/compare.

The client is imported lazily (only these commands need it).
"""
from __future__ import annotations

import base64
import binascii
import io
import json
import tarfile
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Optional

from k3infra.bench import manifests as b
from k3infra.podcommon import sha256_file

SERVING_SELECTOR = "app.kubernetes.io/name=kimi-k3,app.kubernetes.io/component=serving"
JOB_SELECTOR = f"app.kubernetes.io/component={b.COMPONENT}"
READER_START_SECONDS = 300


class ClusterError(RuntimeError):
    """The cluster could not be read as needed; the message says what and where."""


def connect(kubeconfig: Optional[str] = None, context: Optional[str] = None) -> Any:
    try:
        from kubernetes import client, config
    except ImportError as exc:
        raise ClusterError(f"the kubernetes client is not installed ({exc})") from None
    try:
        config.load_kube_config(config_file=kubeconfig, context=context)
    except Exception as exc:  # the client raises several unrelated types here
        raise ClusterError(f"cannot load kubeconfig ({exc})") from None
    return client.ApiClient()


class KubeCluster:
    """The few reads verify needs, as plain dicts (camelCase, as the API serves them)."""

    def __init__(self, api: Any, namespace: str):
        from kubernetes import client

        self.api, self.namespace = api, namespace
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)

    def _plain(self, obj: Any) -> dict:
        return self.api.sanitize_for_serialization(obj)

    def _call(self, what: str, fn, *args, **kwargs):
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise ClusterError(f"{what} in namespace {self.namespace}: {exc.status} "
                               f"{exc.reason}") from None
        except OSError as exc:
            raise ClusterError(f"{what}: cluster not reachable ({exc})") from None

    def statefulset(self) -> dict:
        items = self._call("listing StatefulSets", self.apps.list_namespaced_stateful_set,
                           self.namespace, label_selector=SERVING_SELECTOR).items
        if len(items) != 1:
            raise ClusterError(f"expected one serving StatefulSet ({SERVING_SELECTOR}) in "
                               f"namespace {self.namespace}, found {len(items)}")
        return self._plain(items[0])

    def read_file(self, pod: str, container: str, path: str) -> Optional[str]:
        """A text file inside a running container; None when it does not exist."""
        from kubernetes.stream import stream

        script = ("import sys\ntry: sys.stdout.write(open(sys.argv[1]).read())\n"
                  "except FileNotFoundError: sys.exit(3)")
        resp = self._call(f"exec in pod {pod}", stream,
                          self.core.connect_get_namespaced_pod_exec, pod, self.namespace,
                          container=container, command=["python3", "-c", script, path],
                          stderr=True, stdin=False, stdout=True, tty=False,
                          _preload_content=False)
        resp.run_forever(timeout=60)
        code = resp.returncode
        out = resp.read_stdout()
        resp.close()
        if code == 3:
            return None
        if code:
            raise ClusterError(f"reading {path} in pod {pod} failed (exit {code})")
        return out

    def benchmark_job(self) -> Optional[dict]:
        items = self._call("listing Jobs", self.batch.list_namespaced_job, self.namespace,
                           label_selector=JOB_SELECTOR).items
        return self._plain(items[0]) if items else None

    def exec_reader(self, pod_manifest: dict, command: list[str]) -> str:
        """Create the reader pod, run `command` in it, delete it; stdout as text."""
        from kubernetes.stream import stream

        name = pod_manifest["metadata"]["name"]
        self._call("creating the reader pod", self.core.create_namespaced_pod, self.namespace,
                   pod_manifest)
        try:
            deadline = time.monotonic() + READER_START_SECONDS
            while True:
                pod = self._call("reading the reader pod", self.core.read_namespaced_pod,
                                 name, self.namespace)
                if pod.status.phase == "Running":
                    break
                if pod.status.phase in ("Failed", "Succeeded") or time.monotonic() > deadline:
                    raise ClusterError(f"reader pod {name} did not start (phase "
                                       f"{pod.status.phase}); is the results claim bound?")
                time.sleep(2)
            resp = self._call("exec in the reader pod", stream,
                              self.core.connect_get_namespaced_pod_exec, name, self.namespace,
                              container="reader", command=command, stderr=True, stdin=False,
                              stdout=True, tty=False, _preload_content=False)
            chunks, errors = [], []
            while resp.is_open():
                resp.update(timeout=5)
                if resp.peek_stdout():
                    chunks.append(resp.read_stdout())
                if resp.peek_stderr():
                    errors.append(resp.read_stderr())
            code = resp.returncode
            resp.close()
            if code:
                raise ClusterError("reading the results failed: " + "".join(errors).strip())
            return "".join(chunks)
        finally:
            self._call("deleting the reader pod", self.core.delete_namespaced_pod, name,
                       self.namespace, grace_period_seconds=0)


# --- evidence on the local side (pure file work, tested without a cluster) -------------

def unpack_run(payload_b64: str, out: Path) -> Path:
    """Extract the reader's base64 tar.gz into `out`; refuses links and escaping paths."""
    try:
        raw = base64.b64decode(payload_b64.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ClusterError("the reader returned no valid base64 archive") from None
    try:
        tar = tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz")
    except tarfile.TarError as exc:
        raise ClusterError(f"the reader returned no valid archive ({exc})") from None
    roots = set()
    with tar:
        members = tar.getmembers()
        for m in members:
            p = PurePosixPath(m.name)
            if p.is_absolute() or ".." in p.parts or not (m.isfile() or m.isdir()):
                raise ClusterError(f"refusing archive member {m.name!r}")
            roots.add(p.parts[0])
        if len(roots) != 1:
            raise ClusterError(f"expected one run directory in the archive, got {sorted(roots)}")
        out.mkdir(parents=True, exist_ok=True)
        for m in members:
            target = out / m.name
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(m).read())
    return out / roots.pop()


def check_sums(run_dir: Path) -> list[str]:
    """Problems with the run's SHA256SUMS: missing file, wrong hash, unlisted file."""
    sums_path = run_dir / "SHA256SUMS"
    if not sums_path.is_file():
        return [f"{run_dir}: no SHA256SUMS"]
    listed = {}
    for line in sums_path.read_text().splitlines():
        digest, _, rel = line.partition("  ")
        listed[rel] = digest
    problems = []
    for rel, digest in listed.items():
        path = run_dir / rel
        if not path.is_file():
            problems.append(f"{rel}: listed in SHA256SUMS, missing")
        elif sha256_file(path) != digest:
            problems.append(f"{rel}: sha256 differs from SHA256SUMS")
    for path in sorted(run_dir.rglob("*")):
        rel = path.relative_to(run_dir).as_posix()
        if path.is_file() and rel not in listed and rel not in ("SHA256SUMS", "index.json"):
            problems.append(f"{rel}: not listed in SHA256SUMS")
    return problems


def measured_results(run_dir: Path) -> list[Path]:
    """The run's measured result files, from its index (warm-ups are not compared)."""
    index = json.loads((run_dir / "index.json").read_text())
    return [run_dir / s["result"] for s in index.get("sets", []) if s.get("role") == "measured"]


def fetch_results(api: Any, namespace: str, out: Path, image: Optional[str] = None,
                  run_id: str = "", cluster: Optional[KubeCluster] = None) -> Path:
    """Copy the latest complete run (or `run_id`) from the results PVC into out/<run id>;
    returns that directory after checking every file against the run's SHA256SUMS."""
    cluster = cluster or KubeCluster(api, namespace)
    job = cluster.benchmark_job()
    if job is None:
        raise ClusterError(f"no benchmark Job ({JOB_SELECTOR}) in namespace {namespace}: "
                           "enable k3:benchmark.enabled and run pulumi up")
    pod_spec = job["spec"]["template"]["spec"]
    claim = (job["metadata"].get("annotations") or {}).get("k3infra.dev/results-claim")
    if not claim:
        raise ClusterError(f"Job {job['metadata']['name']} names no results claim")
    image = image or pod_spec["containers"][0]["image"]
    name = f"{job['metadata']['name']}-reader-{uuid.uuid4().hex[:6]}"
    payload = cluster.exec_reader(b.reader_pod(name, namespace, claim, image, pod_spec),
                                  b.export_command(run_id))
    run_dir = unpack_run(payload, out)
    problems = check_sums(run_dir)
    if problems:
        raise ClusterError("fetched files do not match the run's SHA256SUMS: "
                           + "; ".join(problems))
    return run_dir
