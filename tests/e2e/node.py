"""A real node for the e2e tests: kube-scheduler, a kubelet on containerd + runc, a bridge
CNI, kube-proxy and CoreDNS, joined to the control plane of ``tests/e2e/apiserver.py``.

Everything runs inside the network namespace ``tests/e2e/netns.sh`` makes for the whole
``make e2e`` run (it exports K3INFRA_E2E_NODE_IP, the namespace's own address): nothing
listens outside it and no packet leaves it. Images are the project's own
(``tools/images/build.sh``: Debian packages packed with umoci), pushed to a registry
(Debian's ``docker-registry``) on the namespace's address, where the pods' BuildKit
reaches it too, and pulled by digest, like the product pins them.

What differs from a user's node, and why:
- the kubelet authenticates to the API server with the admin certificate (no TLS
  bootstrap, no Node authorizer): one throw-away cluster;
- containerd sets ``restrict_oom_score_adj``: this VM drops CAP_SYS_RESOURCE, so runc
  cannot lower a container's oom_score_adj;
- the node advertises ``nvidia.com/gpu`` (``GPUS``) through a status patch, as a device
  plugin would, without a device: vLLM runs on CPU; the node carries the test receipt's
  GPU product label so the product's node affinity is unchanged;
- the volumes are static PersistentVolumes (``local``, directories in the test's folder)
  of a StorageClass with no provisioner: the cluster has no storage driver;
- CoreDNS runs as a process of the node, not as a pod (it needs only the API);
- kube-proxy masquerades all Service traffic (``masqueradeAll``): pods on one bridge
  reach each other's Services without relying on the host's bridge netfilter setting;
- ``node_fixture(..., nodes=2)`` starts a second kubelet (``k3e2e-node-2``) beside the first,
  on its own containerd, bridge (10.244.1.0/24), kubelet port and cgroup root (two
  kubelets under one ``kubepods`` would each reap the other's pods as orphans); the
  scheduler, kube-proxy, CoreDNS and the registry are shared. Both share the machine's
  disk: every static volume's node affinity names both nodes, as a shared filesystem
  (the weights' ReadWriteMany volume) would be on a real cluster;
- NetworkPolicies are enforced only on a node started with ``network_policy=True``:
  kube-router's policy controller (``tools/testbed/netpol``, iptables and ipset) runs
  beside the bridge CNI as a process of the node, not as a DaemonSet; the other nodes
  enforce none (the bridge CNI has no policy engine).
- ``node_fixture(..., cgroup_root="/k3e2e-...")`` puts the module's kubelets under a cgroup
  root of their own, so the module can run beside another module's kubelet (the host
  lane of tests/e2e/tiers.sh runs such modules beside the node lane).
The kernel settings the kubelet changes (``KUBELET_SYSCTLS``) are restored once the
last kubelet of the machine has stopped (``SYSCTLS_SAVED``, shared by the sessions).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from apiserver import SERVICE_CIDR, Cluster, ClusterError, _Processes, _free_port, report

NODE_IP_ENV = "K3INFRA_E2E_NODE_IP"
NODES_ENV = "K3INFRA_E2E_NODES"          # a module that offers two nodes reads it (1 or 2)
NODE_NAME = "k3e2e-node"
CLUSTER_CIDR = "10.244.0.0/16"           # node i's pods: 10.244.i.0/24 on bridge k3br<i>
GPUS = 1
GPU_RESOURCE = "nvidia.com/gpu"
STORAGE_CLASS = "k3e2e-local"
NETPOL_CHAIN = "KUBE-ROUTER-FORWARD"    # kube-router's top-level chain (filter table)
START_TIMEOUT_S = 240.0
ROOT = Path(__file__).resolve().parents[2]
IMAGE_BUILD = ROOT / "tools" / "images" / "build.sh"
# Set by the kubelet at start (pkg/kubelet/cm/container_manager_linux.go): global, not
# per network namespace, so they are put back when the node stops.
KUBELET_SYSCTLS = ("vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic",
                   "kernel.panic_on_oops", "kernel.keys.root_maxkeys",
                   "kernel.keys.root_maxbytes")


@dataclass(frozen=True)
class Node:
    """The running node, as the tests see it."""

    name: str
    ip: str                          # InternalIP; pods reach the node's services here
    cluster: Cluster
    images: dict[str, str]           # image name -> pinned reference in the registry
    registry: str                    # host:port of the registry (node address, plain HTTP)
    workdir: Path
    volumes: Path                    # the static PersistentVolumes' directories
    product_label: str
    start_seconds: float
    network_policy: bool             # NetworkPolicies enforced (kube-router's controller)
    names: tuple[str, ...] = ()      # every node of the set (this one first)
    _pv_count: list = field(default_factory=lambda: [0])

    def containerd_socket(self, node_name: str | None = None) -> Path:
        index = self.names.index(node_name) if node_name else 0
        return _NodeParts(self.workdir, index).containerd / "containerd.sock"

    def crictl(self, *args: str, node_name: str | None = None) -> str:
        """`ctr` against a node's containerd (k8s.io namespace), for faults and checks."""
        return subprocess.run(["ctr", "--address", str(self.containerd_socket(node_name)),
                               "--namespace", "k8s.io", *args],
                              check=True, capture_output=True, text=True).stdout

    def add_volume(self, name: str, size_gi: int, access: str = "ReadWriteOnce") -> Path:
        """A static local PersistentVolume of STORAGE_CLASS (a directory on the node)."""
        from kubernetes import client

        path = self.volumes / name
        path.mkdir(parents=True)
        # The pods' fsGroup owns what they write; the directory itself must let them in.
        path.chmod(0o777)
        pv = {"apiVersion": "v1", "kind": "PersistentVolume",
              "metadata": {"name": name, "labels": {"k3e2e/volume": name}},
              "spec": {"capacity": {"storage": f"{size_gi}Gi"}, "accessModes": [access],
                       "persistentVolumeReclaimPolicy": "Retain",
                       "storageClassName": STORAGE_CLASS, "local": {"path": str(path)},
                       "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                           {"key": "kubernetes.io/hostname", "operator": "In",
                            "values": list(self.names or (self.name,))}]}]}}}}
        with self.cluster.api_client() as api:
            client.CoreV1Api(api).create_persistent_volume(pv)
        return path


def wait_for(what: str, check, timeout: float, interval: float = 1.0):
    """check()'s first truthy value within `timeout` seconds; else AssertionError naming
    `what` and the last value (a test's wait for a pod, a Service, a rollout)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not after {timeout:.0f} s (last: {last!r})")


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


@contextlib.contextmanager
def _kernel_settings_restored() -> Iterator[None]:
    """The machine's values before the first kubelet changed them, restored when the last
    session that runs one ends: two lanes' kubelets overlap, and a session that saved
    while another's kubelet ran would restore that kubelet's values (kernel.panic=10)."""
    with _sysctl_users() as users:
        if not users["pids"]:
            users["saved"] = {}
            for name in KUBELET_SYSCTLS:
                with contextlib.suppress(OSError):
                    users["saved"][name] = _sysctl_path(name).read_text()
        users["pids"].append(os.getpid())
    try:
        yield
    finally:
        with _sysctl_users() as users:
            users["pids"] = [p for p in users["pids"] if p != os.getpid()]
            if not users["pids"]:
                for name, value in users["saved"].items():
                    with contextlib.suppress(OSError):
                        _sysctl_path(name).write_text(value)


SYSCTLS_SAVED = Path("/tmp/k3e2e-sysctls.json")


@contextlib.contextmanager
def _sysctl_users() -> Iterator[dict]:
    """{"pids": sessions running a kubelet, "saved": the machine's values}, read and written
    under a lock; the pids of sessions that died are dropped (their values stay saved)."""
    import fcntl

    with open(SYSCTLS_SAVED.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            users = json.loads(SYSCTLS_SAVED.read_text())
        except (OSError, ValueError):
            users = {"pids": [], "saved": {}}
        users["pids"] = [p for p in users["pids"] if Path(f"/proc/{p}").exists()]
        yield users
        if users["pids"]:
            SYSCTLS_SAVED.write_text(json.dumps(users))
        else:
            SYSCTLS_SAVED.unlink(missing_ok=True)


def image_layout(name: str) -> Path:
    """The cached OCI layout of one of the project's test images. `make e2e` builds them
    before entering the network namespace; here a cached one is only looked up."""
    proc = subprocess.run([str(IMAGE_BUILD), "--cached", name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"{IMAGE_BUILD} {name} failed (run `make e2e`, which builds the "
                           f"images before the tests):\n{proc.stderr[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class _NodeParts:
    """What is one node's own: its name, containerd, bridge, kubelet port and cgroup root."""

    workdir: Path
    index: int
    root: str = "/"             # the module's cgroup root (node_fixture's cgroup_root)

    @property
    def name(self) -> str:
        return NODE_NAME if self.index == 0 else f"{NODE_NAME}-{self.index + 1}"

    @property
    def dir(self) -> Path:          # the first node's paths are those of a one-node run
        return self.workdir if self.index == 0 else self.workdir / self.name

    @property
    def containerd(self) -> Path:
        return self.dir / "containerd"

    @property
    def bridge(self) -> str:
        return f"k3br{self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def cgroup_root(self) -> str:
        return self.root if self.index == 0 else f"{self.root.rstrip('/')}/{self.name}"


def _cgroup_dirs(root: str) -> list[Path]:
    """The node's cgroup root in every cgroup v1 hierarchy (and v2's, where mounted)."""
    base = Path("/sys/fs/cgroup")
    hierarchies = [d for d in base.iterdir() if d.is_dir()] if not (base / "cgroup.controllers").exists() \
        else [base]
    return [h / root.strip("/") for h in hierarchies]


def _make_cgroup_root(root: str) -> None:
    """The kubelet refuses a cgroup root that does not exist; a new cpuset child has no
    CPUs or memory nodes until given its parent's."""
    for path in _cgroup_dirs(root):
        path.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (path / name).exists() and not (path / name).read_text().strip():
                (path / name).write_text((path.parent / name).read_text())


def _remove_cgroup_root(root: str) -> None:
    """Depth first: a cgroup directory goes once its children and processes are gone."""
    for top in _cgroup_dirs(root):
        if top.is_dir():
            for path in sorted((p for p in top.rglob("*") if p.is_dir()),
                               key=lambda p: len(p.parts), reverse=True) + [top]:
                with contextlib.suppress(OSError):
                    path.rmdir()


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _containerd_config(work: Path, registry: str, pause: str, cni: Path) -> Path:
    hosts = work / "certs.d"
    _write(hosts / registry / "hosts.toml",
           f'server = "http://{registry}"\n[host."http://{registry}"]\n'
           '  capabilities = ["pull", "resolve"]\n')
    return _write(work / "config.toml", f"""version = 2
root = "{work / 'root'}"
state = "{work / 'state'}"
[grpc]
  address = "{work / 'containerd.sock'}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{work / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # This VM drops CAP_SYS_RESOURCE: runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{hosts}"
""")


def _cni_config(node: _NodeParts) -> Path:
    """The node's bridge and pod range; pods of the two nodes reach each other through
    the namespace's routes (both bridges are its own)."""
    work = node.dir
    _write(work / "cni" / "10-k3e2e.conflist", json.dumps({
        "cniVersion": "0.4.0", "name": "k3e2e",
        "plugins": [{"type": "bridge", "bridge": node.bridge, "isGateway": True, "ipMasq": True,
                     "hairpinMode": True,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_cidr}]],
                              "routes": [{"dst": "0.0.0.0/0"}],
                              "dataDir": str(work / "cni-ipam")}},
                    {"type": "portmap", "capabilities": {"portMappings": True}}]}, indent=1))
    return work / "cni"


def _kubelet_config(node: _NodeParts, cluster: Cluster, node_ip: str, socket: Path) -> Path:
    pki, work = cluster.workdir / "pki", node.dir
    return _write(work / "kubelet.yaml", json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": node_ip, "port": 10250 + node.index, "readOnlyPort": 0, "healthzPort": 0,
        "cgroupRoot": node.cgroup_root,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(pki / "ca.crt")}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{socket}",
        "clusterDNS": [node_ip], "clusterDomain": "cluster.local",
        "resolvConf": str(_write(work / "resolv.conf", f"nameserver {node_ip}\n")),
        "failSwapOn": False,
        "podLogsDir": str(work / "pod-logs"),
        "serializeImagePulls": False,
        # A busy 2-core test machine: no eviction or image GC under the tests' feet.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "maxPods": 30,
        "registerNode": True,
        "staticPodPath": "",
        "fileCheckFrequency": "5s",
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
    }, indent=1))


def _proxy_config(work: Path, kubeconfig: Path) -> Path:
    return _write(work / "kube-proxy.yaml", json.dumps({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME, "mode": "iptables", "clusterCIDR": CLUSTER_CIDR,
        "iptables": {"masqueradeAll": True, "syncPeriod": "5s", "minSyncPeriod": "0s"},
        # Conntrack limits are global, not per namespace: leave the machine's alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
        "healthzBindAddress": "", "metricsBindAddress": f"127.0.0.1:{_free_port()}",
    }, indent=1))


def _corefile(work: Path, node_ip: str, kubeconfig: Path, context: str) -> Path:
    # Every address of the test's network namespace (nothing else can reach it).
    return _write(work / "Corefile", f""".:53 {{
    errors
    ready {node_ip}:{_free_port()}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} {context}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
}}
""")


def _wait(what: str, ready, procs: _Processes, deadline: float, interval: float = 0.5) -> None:
    last = ""
    while time.monotonic() < deadline:
        procs.check_alive()
        try:
            if ready():
                return
        except Exception as exc:  # noqa: BLE001 - the last error goes into the message
            last = f" (last: {exc})"
        time.sleep(interval)
    raise ClusterError(f"{what} not ready after {START_TIMEOUT_S:.0f} s{last}\n{procs.logs()}")


def _node_ready(cluster: Cluster, name: str) -> bool:
    from kubernetes import client

    with cluster.api_client() as api:
        node = client.CoreV1Api(api).read_node(name)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def _advertise_gpus(cluster: Cluster, name: str) -> None:
    """What a device plugin does: the node's capacity names the extended resource."""
    from kubernetes import client

    with cluster.api_client() as api:
        client.CoreV1Api(api).patch_node_status(
            name, {"status": {"capacity": {GPU_RESOURCE: str(GPUS)}}})


def _gpus_allocatable(cluster: Cluster, name: str) -> bool:
    from kubernetes import client

    with cluster.api_client() as api:
        node = client.CoreV1Api(api).read_node(name)
    return (node.status.allocatable or {}).get(GPU_RESOURCE) == str(GPUS)


def _storage_class(cluster: Cluster) -> None:
    from kubernetes import client

    with cluster.api_client() as api:
        client.StorageV1Api(api).create_storage_class({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "Immediate"})


def _policy_chains_ready() -> bool:
    """kube-router's top-level chains exist once its first full sync ran: from then on
    every pod it sees is policed."""
    return subprocess.run(["iptables", "-w", "-S", NETPOL_CHAIN], capture_output=True).returncode == 0


@contextlib.contextmanager
def run_node(cluster: Cluster, workdir: Path, node_ip: str, product_label: str,
             images: tuple[str, ...], network_policy: bool = False,
             nodes: int = 1, cgroup_root: str = "/") -> Iterator[Node]:
    """Start the registry, CoreDNS, kube-scheduler and kube-proxy, then containerd and a
    kubelet per node (`nodes`: 1 or 2; with `network_policy` kube-router's NetworkPolicy
    controller); push `images` (plus the pause image); stop everything on exit."""
    from registry import remove_stores, run_registry

    started = time.monotonic()
    deadline = started + START_TIMEOUT_S
    bin_dir = cluster.bin_dir
    procs = _Processes(workdir)
    parts = [_NodeParts(workdir, i, cgroup_root) for i in range(nodes)]
    with _kernel_settings_restored(), run_registry(workdir / "registry", host=node_ip) as reg:
        try:
            pushed = {name: reg.push(image_layout(name), f"k3e2e/{name}", "e2e")
                      for name in ("pause", *images)}
            procs.start("coredns", [str(bin_dir / "coredns"), "-conf",
                                    str(_corefile(workdir, node_ip, cluster.kubeconfig,
                                                  cluster.context))])
            procs.start("kube-scheduler", [
                str(bin_dir / "kube-scheduler"), f"--kubeconfig={cluster.kubeconfig}",
                "--leader-elect=false", "--secure-port=0"])
            for part in parts:
                _start_kubelet(procs, part, cluster, node_ip, product_label, reg.address,
                               pushed["pause"], deadline)
            procs.start("kube-proxy", [str(bin_dir / "kube-proxy"),
                                       f"--config={_proxy_config(workdir, cluster.kubeconfig)}"])
            for part in parts:
                _wait(f"node {part.name} Ready", lambda: _node_ready(cluster, part.name), procs,
                      deadline)
                _advertise_gpus(cluster, part.name)
                _wait(f"{GPU_RESOURCE} allocatable on {part.name}",
                      lambda: _gpus_allocatable(cluster, part.name), procs, deadline)
            _storage_class(cluster)
            if network_policy:
                # After Ready: the controller reads the node's InternalIP at start.
                procs.start("kube-router-netpol", [
                    str(bin_dir / "kube-router-netpol"), f"--kubeconfig={cluster.kubeconfig}",
                    f"--hostname-override={NODE_NAME}",
                    f"--service-cluster-ip-range={SERVICE_CIDR}", "-v=1"])
                _wait("NetworkPolicy controller", _policy_chains_ready, procs, deadline)
            yield Node(name=NODE_NAME, ip=node_ip, cluster=cluster, images=pushed,
                       registry=reg.address, workdir=workdir, volumes=workdir / "volumes",
                       product_label=product_label,
                       start_seconds=time.monotonic() - started, network_policy=network_policy,
                       names=tuple(p.name for p in parts))
        finally:
            procs.stop()
            for part in parts:
                _remove_pod_sandboxes(part.containerd)
                # containerd's content and snapshots (about 10 GB with the engine image);
                # the registry removes its blobs itself as it stops. The logs stay.
                remove_stores(part.containerd / "root")
                if part.cgroup_root != "/":
                    _remove_cgroup_root(part.cgroup_root)


def _start_kubelet(procs: _Processes, part: _NodeParts, cluster: Cluster, node_ip: str,
                   product_label: str, registry: str, pause: str, deadline: float) -> None:
    """One node's containerd and kubelet."""
    suffix = f"-{part.index + 1}" if part.index else ""
    if part.cgroup_root != "/":
        _make_cgroup_root(part.cgroup_root)
    procs.start(f"containerd{suffix}", ["containerd", "--config", str(_containerd_config(
        part.containerd, registry, pause, _cni_config(part)))])
    socket = part.containerd / "containerd.sock"
    _wait(f"containerd{suffix}", socket.exists, procs, deadline)
    kubelet_dir = part.dir / "kubelet"
    procs.start(f"kubelet{suffix}", [
        str(cluster.bin_dir / "kubelet"),
        f"--config={_kubelet_config(part, cluster, node_ip, socket)}",
        f"--kubeconfig={cluster.kubeconfig}", f"--root-dir={kubelet_dir}",
        f"--node-ip={node_ip}", f"--hostname-override={part.name}",
        f"--node-labels=nvidia.com/gpu.product={product_label}",
        f"--cert-dir={kubelet_dir / 'pki'}", "--v=1"])


def _remove_pod_sandboxes(containerd: Path) -> None:
    """Containers the kubelet left (it does not stop pods when it stops): kill what still
    runs under the node's runc root, so nothing outlives the test run."""
    root = containerd / "state"
    for pidfile in root.rglob("init.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), 9)


def missing(cluster_bin: Path, network_policy: bool = False) -> str | None:
    """Why the node cannot start here, or None."""
    if not os.environ.get(NODE_IP_ENV):
        return (f"{NODE_IP_ENV} is not set: the node tier runs inside the network namespace "
                "tests/e2e/netns.sh makes (`make e2e`)")
    binaries = ("kube-scheduler", "kubelet", "kube-proxy", "coredns",
                *(("kube-router-netpol",) if network_policy else ()))
    lacking = [b for b in binaries if not os.access(cluster_bin / b, os.X_OK)]
    if lacking:
        return f"{cluster_bin} lacks {', '.join(lacking)}: run tools/testbed/build.sh"
    for tool in ("containerd", "runc", "ctr", "docker-registry", "skopeo",
                 *(("ipset",) if network_policy else ())):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            return f"{tool} is not installed (.ci/run installs the node's Debian packages)"
    return None


def node_fixture(product_label: str, images: tuple[str, ...], network_policy: bool = False,
                 nodes: int = 1, cgroup_root: str = "/"):
    """A session fixture `node` for a test receipt's GPU product label and images; with
    `network_policy` the node enforces NetworkPolicies; `nodes` kubelets (1 or 2); a
    `cgroup_root` of its own lets the module run beside another module's kubelet."""

    @pytest.fixture(scope="session")
    def node(request: pytest.FixtureRequest, cluster: Cluster, tmp_path_factory) -> Iterator[Node]:
        reason = missing(cluster.bin_dir, network_policy)
        if reason:
            pytest.skip(reason)
        workdir = tmp_path_factory.mktemp("node")
        with run_node(cluster, workdir, os.environ[NODE_IP_ENV], product_label, images,
                      network_policy, nodes, cgroup_root) as n:
            enforcing = ", kube-router's NetworkPolicy controller" if network_policy else ""
            report(request.config,
                   f"\nnode {', '.join(n.names)} ({n.ip}): kubelet, containerd, kube-proxy, CoreDNS{enforcing}; "
                   f"Ready with {GPU_RESOURCE}={GPUS} in {n.start_seconds:.1f} s; "
                   f"images {', '.join(n.images.values())}; logs in {workdir}")
            yield n

    return node
