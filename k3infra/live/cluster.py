"""Reading a live cluster for `k3infra verify` and `k3infra bench fetch` through the
`kubernetes` Python client and the user's kubeconfig. Thin: find objects, read a file
in the serving pod, run the results reader pod; every decision is in drift/compare.

The client is imported lazily, in connect() and _kubernetes() only: it is an optional
dependency (the `cluster` extra) and takes 0.54 s to import (python -X importtime), which
`k3infra startup --log` and every command off a cluster never pay.
"""
from __future__ import annotations

import json
import time
from typing import Any, Optional

from k3infra import naming, topology

SERVING_SELECTOR = f"app.kubernetes.io/name={naming.APP},app.kubernetes.io/component=serving"
JOB_SELECTOR = f"app.kubernetes.io/component={naming.BENCHMARK_COMPONENT}"
READER_START_SECONDS = 300


# What read_file runs in the container: the bounded reader's rule in a few lines (the
# image has no k3infra): a regular file after a no-follow, non-blocking open (a FIFO or
# a link to /dev/zero swapped in by whoever writes the volume never hangs or floods),
# at most READ_MAX_BYTES. Exit 3: absent; 4: not a regular file, or larger.
READ_MAX_BYTES = 64 << 20
LOG_MAX_BYTES = 512 << 20
READ_SCRIPT = (
    "import os, stat, sys\n"
    "limit = int(sys.argv[2])\n"
    "try:\n"
    "    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)\n"
    "except FileNotFoundError:\n"
    "    sys.exit(3)\n"
    "except OSError:\n"
    "    sys.exit(4)\n"
    "st = os.fstat(fd)\n"
    "if not stat.S_ISREG(st.st_mode) or st.st_size > limit:\n"
    "    sys.exit(4)\n"
    "data = b''\n"
    "while len(data) <= limit:\n"
    "    chunk = os.read(fd, 1 << 20)\n"
    "    if not chunk:\n"
    "        break\n"
    "    data += chunk\n"
    "if len(data) > limit:\n"
    "    sys.exit(4)\n"
    "sys.stdout.write(data.decode('utf-8', 'replace'))\n")


class ClusterError(RuntimeError):
    """The cluster could not be read as needed; the message says what and where."""


def connect(kubeconfig: Optional[str] = None, context: Optional[str] = None) -> Any:
    try:
        from kubernetes import client, config      # optional, 0.54 s: the module docstring
    except ImportError as exc:
        raise ClusterError(f"the kubernetes client is not installed ({exc}): "
                           "pip install 'k3infra[cluster]'") from None
    try:
        config.load_kube_config(config_file=kubeconfig, context=context)
    except Exception as exc:  # the client raises several unrelated types here
        raise ClusterError(f"cannot load kubeconfig ({exc})") from None
    return client.ApiClient()


def _api_message(exc: Any) -> str:
    """The server's own Status message when it sent one. An exec refused at the websocket
    handshake arrives as status 0 with the response headers and body in `reason`."""
    body = exc.body or str(exc.reason or "").rsplit(" -+-+- ", 1)[-1]
    try:
        status = json.loads(body)
    except (TypeError, ValueError):
        status = None
    if isinstance(status, dict) and status.get("message"):
        return f"{status.get('code', exc.status)} {status['message']}"
    return f"{exc.status} {exc.reason}"


def _kubernetes():
    """(the client module, ApiException, stream) of the kubernetes package, which
    connect() has already imported (optional, 0.54 s: the module docstring)."""
    from kubernetes import client
    from kubernetes.stream import stream

    return client, client.ApiException, stream


class KubeCluster:
    """The few reads verify needs, as plain dicts (camelCase, as the API serves them)."""

    def __init__(self, api: Any, namespace: str):
        client, self._api_exception, self._stream = _kubernetes()
        self._client = client
        self.api, self.namespace = api, namespace
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)

    def _plain(self, obj: Any) -> dict:
        return self.api.sanitize_for_serialization(obj)

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except self._api_exception as exc:
            raise ClusterError(f"{what} in namespace {self.namespace}: "
                               f"{_api_message(exc)}") from None
        except OSError as exc:
            raise ClusterError(f"{what}: cluster not reachable ({exc})") from None

    def statefulset(self) -> dict:
        items = self._call("listing StatefulSets", self.apps.list_namespaced_stateful_set,
                           self.namespace, label_selector=SERVING_SELECTOR).items
        if len(items) != 1:
            raise ClusterError(f"expected one serving StatefulSet ({SERVING_SELECTOR}) in "
                               f"namespace {self.namespace}, found {len(items)}")
        return self._plain(items[0])

    def serving_pods(self) -> list[dict]:
        items = self._call("listing serving pods", self.core.list_namespaced_pod,
                           self.namespace, label_selector=SERVING_SELECTOR).items
        return sorted((self._plain(p) for p in items), key=lambda p: p["metadata"]["name"])

    def container_log(self, pod: str, container: str, previous: bool = False) -> str:
        """The container's log with the kubelet's RFC 3339 timestamps on every line."""
        # Bounded as a log file is (k3infra.fileformats: "container log"): the kubelet
        # keeps whole logs, and a start's lines are at the end.
        return self._call(f"reading the log of {pod}/{container}",
                          self.core.read_namespaced_pod_log, pod, self.namespace,
                          container=container, timestamps=True, previous=previous,
                          limit_bytes=LOG_MAX_BYTES)

    def groups(self) -> list[dict]:
        """The serving LeaderWorkerSets of a multi-node stack, by name ([] when there are
        none, or the LeaderWorkerSet CRD is not installed)."""
        group, _, version = topology.LWS_API_VERSION.partition("/")
        try:
            found = self._client.CustomObjectsApi(self.api).list_namespaced_custom_object(
                group, version, self.namespace, "leaderworkersets",
                label_selector=SERVING_SELECTOR)
        except self._api_exception as exc:
            if exc.status == 404:
                return []
            raise ClusterError(f"listing LeaderWorkerSets in namespace {self.namespace}: "
                               f"{_api_message(exc)}") from None
        except OSError as exc:
            raise ClusterError(f"listing LeaderWorkerSets: cluster not reachable ({exc})") from None
        return sorted(found.get("items") or [], key=lambda o: o["metadata"]["name"])

    def read_file(self, pod: str, container: str, path: str) -> Optional[str]:
        """A text file inside a running container; None when it does not exist."""
        resp = self._call(f"exec in pod {pod}", self._stream,
                          self.core.connect_get_namespaced_pod_exec, pod, self.namespace,
                          container=container,
                          command=["python3", "-c", READ_SCRIPT, path, str(READ_MAX_BYTES)],
                          stderr=True, stdin=False, stdout=True, tty=False,
                          _preload_content=False)
        resp.run_forever(timeout=60)
        code = resp.returncode
        out = resp.read_stdout()
        resp.close()
        if code == 3:
            return None
        if code == 4:
            raise ClusterError(f"{path} in pod {pod} is not a regular file of at most "
                               f"{READ_MAX_BYTES} bytes (a link, a FIFO, a device or larger)")
        if code:
            raise ClusterError(f"reading {path} in pod {pod} failed (exit {code})")
        return out

    def benchmark_job(self, selector: str = JOB_SELECTOR) -> Optional[dict]:
        items = self._call("listing Jobs", self.batch.list_namespaced_job, self.namespace,
                           label_selector=selector).items
        return self._plain(items[0]) if items else None

    def exec_reader(self, pod_manifest: dict, command: list[str]) -> str:
        """Create the reader pod, run `command` in it, delete it; stdout as text."""
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
            resp = self._call("exec in the reader pod", self._stream,
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
