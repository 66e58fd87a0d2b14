"""A real Kubernetes control plane on 127.0.0.1 for the e2e tests.

etcd, kube-apiserver and kube-controller-manager, built by
``tools/testbed/cluster/build.sh`` into ``$K3INFRA_TESTBED_BIN``. On its own no scheduler
and no kubelet: Pods stay Pending, which is all the control-plane tests need (admission,
defaulting, validation, field ownership, controllers that create Pods and collect
garbage). The node tier (``tests/e2e/node.py``) adds a node to the same control plane.

The session fixture ``cluster`` starts everything with certificates made by the
``openssl`` CLI, writes an admin kubeconfig into a temporary folder, waits for
``/readyz`` and for the controller manager's first work, prints the server version and
the start time, and stops every process at the end whatever happens. The processes also
die with the test run: each gets SIGKILL when the Python process that started it exits
(PR_SET_PDEATHSIG), so a killed pytest leaves no server behind.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTBED_BIN_ENV = "K3INFRA_TESTBED_BIN"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
HOST = "127.0.0.1"
# The address the `kubernetes` Service's endpoints publish (what `k3infra pins` reads as
# the API server's CIDR). kube-apiserver refuses to publish a loopback address, and then
# published none: the node's IP inside the node tier's network namespace; outside it an
# address of TEST-NET-1 (RFC 5737) that nothing routes, since that tier runs no pod that
# would dial it. The server still listens on HOST only.
ADVERTISED = os.environ.get("K3INFRA_E2E_NODE_IP") or "192.0.2.10"
SERVICE_CIDR = "10.96.0.0/24"
# The controllers the tests rely on (kube-controller-manager's names), and why:
#   namespace          - a deleted namespace's content is removed and the namespace finalizes
#   serviceaccount     - the "default" ServiceAccount; without it the ServiceAccount
#                        admission plugin refuses every Pod, also those controllers create
#   job, statefulset   - Jobs and StatefulSets get their Pods (and PVCs)
#   garbage-collector  - owned objects go with their owner (Pulumi deletes owners only)
#   persistentvolumeclaim-protection - removes the kubernetes.io/pvc-protection finalizer,
#                        else a deleted PVC, and so its namespace, never goes away
CONTROLLERS = (
    "namespace-controller",
    "serviceaccount-controller",
    "job-controller",
    "statefulset-controller",
    "garbage-collector-controller",
    "persistentvolumeclaim-protection-controller",
    # For the node tier (tests/e2e/node.py): the node's not-ready taint goes once it is
    # Ready, Services get EndpointSlices (kube-proxy and CoreDNS read them), claims bind
    # to the static volumes, and a finished Pod of a deleted owner is collected.
    "node-lifecycle-controller",
    "daemonset-controller",        # the engine image's pre-pull DaemonSet rolls out
    "deployment-controller", "replicaset-controller",   # in-cluster weights sources
    "root-ca-certificate-publisher-controller",   # kube-root-ca.crt for token volumes
    "endpointslice-controller",
    "endpoints-controller",        # pulumi-kubernetes awaits a Service's Endpoints
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "pod-garbage-collector-controller",
    # A PodDisruptionBudget's status (disruptionsAllowed), without which the Eviction API
    # refuses every eviction of the pods it selects (tests/e2e/drain.py).
    "disruption-controller",
)
START_TIMEOUT_S = 180.0  # a loaded 2-core machine; a quiet one needs ~10 s
STOP_TIMEOUT_S = 15.0


class ClusterError(RuntimeError):
    """The control plane did not start; the message carries the process's log tail."""


@dataclass(frozen=True)
class Cluster:
    """A running control plane, as the tests see it."""

    server: str  # https://127.0.0.1:PORT
    kubeconfig: Path  # admin (system:masters) kubeconfig, certificates embedded
    context: str
    version: dict  # the server's /version document
    start_seconds: float  # from the first process started to ready
    workdir: Path  # certificates, etcd data, one log file per process
    bin_dir: Path  # the binaries, and crds/ (the Prometheus Operator CRDs build.sh made)

    @property
    def git_version(self) -> str:
        return self.version["gitVersion"]

    def api_client(self):
        """A kubernetes.client.ApiClient for this cluster (no global configuration)."""
        from kubernetes import config

        return config.new_client_from_config(
            config_file=str(self.kubeconfig), context=self.context
        )

    def env(self) -> dict[str, str]:
        """Environment for a child process (pulumi, k3infra) that must use this cluster."""
        return {"KUBECONFIG": str(self.kubeconfig)}

    def has_prometheus_crds(self) -> bool:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        with self.api_client() as api_client:
            try:
                client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
                    "servicemonitors.monitoring.coreos.com")
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
        return True

    def install_prometheus_crds(self, timeout: float = 60.0) -> list[str]:
        """Create the pinned Prometheus Operator CRDs (bin_dir/crds/) and wait until the
        server serves them. Cluster-wide: a session installs them once."""
        return self.install_crds(sorted((self.bin_dir / "crds").glob("*.yaml")), timeout)

    def install_crds(self, paths: list[Path], timeout: float = 60.0) -> list[str]:
        """Create these CRD files (those not there yet) and wait until the server serves
        them; their names."""
        import yaml
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        names = []
        with self.api_client() as api_client:
            ext = client.ApiextensionsV1Api(api_client)
            for path in paths:
                crd = yaml.safe_load(Path(path).read_text())
                try:
                    ext.create_custom_resource_definition(crd)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                names.append(crd["metadata"]["name"])
            deadline = time.monotonic() + timeout
            for name in names:
                while not any(c.type == "Established" and c.status == "True" for c in
                              ext.read_custom_resource_definition(name).status.conditions or []):
                    if time.monotonic() > deadline:
                        raise ClusterError(f"CRD {name} not Established after {timeout:.0f} s")
                    time.sleep(0.25)
        if not names:
            raise ClusterError(f"no CRDs in {self.bin_dir / 'crds'}: run build.sh again")
        return names


# --- processes -----------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class _Processes:
    """Started processes, stopped newest first."""

    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._running: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = self._workdir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self._workdir,
                # Its own session: a Ctrl-C at the terminal reaches pytest only, which
                # then stops the servers in order instead of all dying at once.
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self._running.append((name, proc, log))
        return proc

    def check_alive(self) -> None:
        for name, proc, log in self._running:
            if proc.poll() is not None:
                raise ClusterError(
                    f"{name} exited with status {proc.returncode} during start-up:\n"
                    + _tail(log)
                )

    def stop(self) -> None:
        while self._running:
            name, proc, _log = self._running.pop()
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{_tail(log)}" for name, _p, log in self._running)


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


# --- certificates --------------------------------------------------------------------


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _new_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", str(path))


def _make_pki(pki: Path) -> None:
    """A throw-away CA, the server's certificate, the admin's client certificate and
    the service-account signing key. Valid for two days: a test session only."""
    pki.mkdir(parents=True)
    for name in ("ca", "apiserver", "admin", "service-account"):
        _new_key(pki / f"{name}.key")
    # kube-apiserver verifies tokens with a public key file (it reads no PKCS#8 private
    # key there) and signs them with the private one.
    _openssl("pkey", "-in", str(pki / "service-account.key"), "-pubout",
             "-out", str(pki / "service-account.pub"))
    _openssl("req", "-x509", "-new", "-key", str(pki / "ca.key"), "-days", "2",
             "-subj", "/CN=k3infra-e2e-ca", "-out", str(pki / "ca.crt"),
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    signed = ["-x509", "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"), "-days", "2"]
    _openssl("req", "-new", "-key", str(pki / "apiserver.key"), *signed,
             "-subj", "/CN=kube-apiserver", "-out", str(pki / "apiserver.crt"),
             "-addext", "basicConstraints=critical,CA:FALSE",
             "-addext", "keyUsage=critical,digitalSignature",
             "-addext", "extendedKeyUsage=serverAuth",
             # The first address of the service range is the in-cluster "kubernetes" Service.
             "-addext", f"subjectAltName=IP:{HOST},IP:10.96.0.1,DNS:localhost,"
                        "DNS:kubernetes.default.svc")
    # O=system:masters: the bootstrap RBAC grants that group everything.
    _openssl("req", "-new", "-key", str(pki / "admin.key"), *signed,
             "-subj", "/O=system:masters/CN=k3infra-e2e-admin", "-out", str(pki / "admin.crt"),
             "-addext", "basicConstraints=critical,CA:FALSE",
             "-addext", "keyUsage=critical,digitalSignature",
             "-addext", "extendedKeyUsage=clientAuth")


def _write_kubeconfig(path: Path, server: str, pki: Path, context: str) -> None:
    def data(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    # JSON is YAML: no YAML writer needed, and the certificates travel with the file.
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {
            "server": server, "certificate-authority-data": data("ca.crt")}}],
        "users": [{"name": context, "user": {
            "client-certificate-data": data("admin.crt"),
            "client-key-data": data("admin.key")}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    path.chmod(0o600)


# --- start-up ------------------------------------------------------------------------


def _wait(what: str, ready, procs: _Processes, deadline: float) -> None:
    last = ""
    while time.monotonic() < deadline:
        procs.check_alive()
        try:
            if ready():
                return
        except (OSError, urllib.error.URLError, ssl.SSLError) as exc:
            last = f" (last error: {exc})"
        time.sleep(0.25)
    raise ClusterError(f"{what} not ready after {START_TIMEOUT_S:.0f} s{last}\n{procs.logs()}")


def _https(pki: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def missing_binaries(bin_dir: str | None) -> str | None:
    """Why the control plane cannot start here, or None if it can."""
    if not bin_dir:
        return (f"{TESTBED_BIN_ENV} is not set: build the control plane with "
                "tools/testbed/cluster/build.sh DIR and set it to DIR")
    missing = [b for b in BINARIES if not os.access(Path(bin_dir) / b, os.X_OK)]
    if missing:
        return (f"{TESTBED_BIN_ENV}={bin_dir} has no executable {', '.join(missing)}: "
                "build them with tools/testbed/cluster/build.sh")
    return None


@contextlib.contextmanager
def run_cluster(bin_dir: Path, workdir: Path) -> Iterator[Cluster]:
    """Start etcd, kube-apiserver and kube-controller-manager; stop them on exit."""
    started = time.monotonic()
    deadline = started + START_TIMEOUT_S
    pki = workdir / "pki"
    _make_pki(pki)
    etcd_port, peer_port = _free_port(), _free_port()
    # In a test's own network namespace the API server takes its usual port: the
    # rendered NetworkPolicies open 443 and 6443 to it (the build's report container),
    # and a node that enforces them refuses any other.
    api_port = 6443 if os.environ.get("K3INFRA_E2E_NODE_IP") else _free_port()
    server = f"https://{HOST}:{api_port}"
    context = "k3infra-e2e"
    kubeconfig = workdir / "admin.kubeconfig"
    _write_kubeconfig(kubeconfig, server, pki, context)
    etcd_url = f"http://{HOST}:{etcd_port}"
    peer_url = f"http://{HOST}:{peer_port}"

    procs = _Processes(workdir)
    try:
        procs.start("etcd", [
            str(bin_dir / "etcd"),
            "--name=e2e",
            f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e2e={peer_url}",
            # Throw-away data: skipping fsync keeps a loaded machine's disk out of the way.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ])
        _wait("etcd", lambda: _get(f"{etcd_url}/health")[0] == 200, procs, deadline)

        https = _https(pki)
        procs.start("kube-apiserver", [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            # Inside the node tier's namespace also on the node's address, which the
            # `kubernetes` Service leads to: pods reach the API server (the build Job's
            # report container does); outside it, loopback only.
            f"--bind-address={'0.0.0.0' if os.environ.get('K3INFRA_E2E_NODE_IP') else HOST}",
            f"--advertise-address={ADVERTISED}",
            f"--secure-port={api_port}",
            f"--cert-dir={workdir / 'apiserver'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={server}",
            f"--service-account-key-file={pki / 'service-account.pub'}",
            f"--service-account-signing-key-file={pki / 'service-account.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Defaults, named because the tests depend on them: Pod Security admission
            # decides about privileged Pods (so privileged containers must be allowed at
            # all, as on every real cluster), ServiceAccount and NamespaceLifecycle as
            # a user's cluster has them.
            "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,PodSecurity",
            "--allow-privileged=true",
            "--profiling=false",
            # Logs and exec through the API (kubectl logs, `k3infra startup`) reach the
            # node's kubelet (tests/e2e/node.py) with the admin's client certificate.
            f"--kubelet-client-certificate={pki / 'admin.crt'}",
            f"--kubelet-client-key={pki / 'admin.key'}",
            # By address: the node's name resolves nowhere (and nothing may ask a resolver
            # outside the test's network namespace).
            "--kubelet-preferred-address-types=InternalIP",
        ])
        _wait("kube-apiserver /readyz",
              lambda: _get(f"{server}/readyz", https)[0] == 200, procs, deadline)

        procs.start("kube-controller-manager", [
            str(bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--controllers={','.join(CONTROLLERS)}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--leader-elect=false",
            "--secure-port=0",  # no health server: readiness is its first work, below
        ])
        # The serviceaccount controller's first act: the "default" ServiceAccount in
        # "default". Until it exists no Pod can be created, so the tests would race it.
        _wait("kube-controller-manager (default ServiceAccount)",
              lambda: _get(f"{server}/api/v1/namespaces/default/serviceaccounts/default",
                           https)[0] == 200,
              procs, deadline)

        status, body = _get(f"{server}/version", https)
        if status != 200:
            raise ClusterError(f"GET /version answered {status}: {body[:200]!r}")
        yield Cluster(
            server=server,
            kubeconfig=kubeconfig,
            context=context,
            version=json.loads(body),
            start_seconds=time.monotonic() - started,
            workdir=workdir,
            bin_dir=bin_dir,
        )
    finally:
        procs.stop()


def report(config: pytest.Config, line: str) -> None:
    """A line on the terminal even while pytest captures output (fixture set-up)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        print(line, file=sys.stderr)
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        reporter.write_line(line)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Cluster]:
    """The running control plane; skips when its binaries are not built."""
    bin_dir = os.environ.get(TESTBED_BIN_ENV)
    reason = missing_binaries(bin_dir)
    if reason:
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("cluster")
    with run_cluster(Path(bin_dir), workdir) as running:
        report(request.config,
                f"\nkube-apiserver {running.git_version} "
                f"(etcd and kube-controller-manager beside it) at {running.server}: "
                f"ready in {running.start_seconds:.1f} s; logs in {workdir}")
        yield running
