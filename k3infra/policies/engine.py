"""What the vLLM container does, not what it looks like (issue 28, point 5).

The serving policies elsewhere read the `args` and look for a `gate` word; a container
can keep both and still run something else. These judge behaviour:

- **k3-engine-command**: every pod runs one engine process, in the container named
  `vllm`; its command is exactly the one the builder renders (serving.manifests
  .engine_command: the start script, the gate with its failure fatal, `exec "$@"`), so
  the args it shows are the args it runs; the variables that script reads point the
  gate at the tree vLLM serves, with the lock beside it (or the stack's), through the
  bootstrap and runtime files the builder ships; its probes are the builder's, on the
  engine's loopback /health.
- **k3-engine-exposure**: vLLM listens on 127.0.0.1 only, and nothing exposes the
  engine's port or the pod beyond the proxy: no hostPort, no Service of type
  LoadBalancer / NodePort or aimed at a port other than the proxy's, no NetworkPolicy
  rule opening the engine port (or every port).
- **k3-engine-isolation**: the serving namespace is Pod Security `restricted` and the
  engine runs as non-root; the weights come through no hostPath PersistentVolume.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Optional

from pulumi_policy import (EnforcementLevel, PolicyResource, ReportViolation,
                           StackValidationArgs, StackValidationPolicy)

from k3infra.policies.workloads import (Container, Workload, as_int, get, items, kind_of,
                                        label_selector_matches, mapping, workloads)
from k3infra.pod_env import GATE_ENV_NAMES
from k3infra.serving.manifests import ENGINE_HOST, engine_command, engine_probe_exec
from k3infra.weights import manifests as weights

from k3infra.policies import stack_config
_receipt = stack_config.receipt  # the stack's receipt (k3:receipt), read when a policy runs
ENGINE_CONTAINER = "vllm"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
ENGINE_WORDS = ("vllm.entrypoints", "api_server")


def _engine_processes(c: Container) -> bool:
    """True when `c` starts a vLLM engine (`vllm serve`, the OpenAI server module)."""
    return c.is_vllm_server or any(w in word for word in c.tokens() for w in ENGINE_WORDS)


def _flag(tokens: list[str], flag: str) -> Optional[str]:
    for i, word in enumerate(tokens):
        if word == flag and i + 1 < len(tokens):
            return tokens[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def _builder_pins() -> dict[str, str]:
    """K3_RUNTIME_SHA256 as the builder renders it, without a stack lock."""
    return json.loads(weights.runtime_pins(None))


def _gate_env_problems(c: Container, model: str) -> list[str]:
    env = c.env()
    problems = []
    counts = Counter(str(get(e, "name")) for e in env)
    twice = sorted(n for n, k in counts.items() if k > 1)
    if twice:
        problems.append(f"sets {', '.join(twice)} more than once (the last one wins, unseen)")
    if get(c.spec, "envFrom"):
        problems.append("takes envFrom: variables the gate reads could come from elsewhere")
    for name in GATE_ENV_NAMES:
        entry = next((e for e in env if get(e, "name") == name), None)
        if entry is None or get(entry, "value") is None:
            problems.append(f"{name} is not a literal value the pod spec shows")
    if problems:
        return problems
    value = c.env_value
    tree = value("K3_TREE")
    if tree != model:
        problems.append(f"the gate checks K3_TREE={tree!r}, vLLM serves {model!r}")
    lock = value("K3_LOCK")
    if lock != f"{model}.lock.json":
        problems.append(f"K3_LOCK={lock!r} is not the lock beside the served tree "
                        f"({model}.lock.json)")
    stack_lock = f"{weights.RUNTIME_DIR}/{weights.LOCK_KEY}"
    if value("K3_GATE_LOCK") not in (lock, stack_lock):
        problems.append(f"the gate reads the lock {value('K3_GATE_LOCK')!r}, neither the served "
                        f"tree's ({lock}) nor the stack's ({stack_lock})")
    if value("K3_RUNTIME_DIR") != weights.RUNTIME_DIR:
        problems.append(f"K3_RUNTIME_DIR={value('K3_RUNTIME_DIR')!r}, the runtime is mounted "
                        f"at {weights.RUNTIME_DIR}")
    if value("K3_RUNTIME_BOOTSTRAP") != weights.bootstrap_source():
        problems.append("K3_RUNTIME_BOOTSTRAP is not the builder's bootstrap (which checks the "
                        "runtime files' digests before the gate runs)")
    try:
        pins = json.loads(value("K3_RUNTIME_SHA256") or "")
    except ValueError:
        pins = None
    want = _builder_pins()
    if value("K3_GATE_LOCK") == stack_lock and isinstance(pins, dict):
        want = {**want, weights.LOCK_KEY: pins.get(weights.LOCK_KEY)}
    if pins != want:
        changed = sorted(k for k in set(want) | set(pins or {})
                         if (pins or {}).get(k) != want.get(k))
        problems.append(f"K3_RUNTIME_SHA256 does not pin the shipped runtime files "
                        f"({', '.join(changed) or 'not JSON'}): another gate would run")
    if value("K3_GATE_MODE") not in ("warm", "stamps"):
        problems.append(f"K3_GATE_MODE={value('K3_GATE_MODE')!r}: warm or stamps")
    if value("K3_GATE_STATE") != weights.GATE_STATE_DIR:
        problems.append(f"K3_GATE_STATE={value('K3_GATE_STATE')!r}, the pod-private record "
                        f"lives at {weights.GATE_STATE_DIR}")
    return problems


def _probe_problems(c: Container, port: Optional[str]) -> list[str]:
    problems = []
    for probe in PROBES:
        spec = get(c.spec, probe)
        if spec is None:
            continue            # k3-startup-budget requires the startup probe
        timeout = as_int(get(spec, "timeoutSeconds")) or 1      # the API's default
        want = engine_probe_exec(int(port), timeout)["command"] if port and port.isdigit() else None
        others = sorted(k for k in ("tcpSocket", "httpGet", "grpc") if get(spec, k) is not None)
        found = [str(w) for w in items(get(spec, "exec", "command"))]
        if others or found != want:
            problems.append(f"its {probe} is not the builder's exec of vLLM's own /health on "
                            f"{ENGINE_HOST}:{port} ({', '.join(others) or 'another command'}): "
                            "a probe on the proxy passes while the engine is down")
    return problems


def _command_problems(wl: Workload) -> list[str]:
    engines = [c for c in wl.containers() if _engine_processes(c)]
    problems = []
    if len(engines) > 1:
        problems.append(f"{len(engines)} containers start a vLLM engine "
                        f"({', '.join(f'{c.list_name}/{c.name}' for c in engines)}); one pod "
                        "runs one engine, on the one verified tree")
    for c in engines:
        where = f"{c.list_name[:-1]} {c.name}"
        if c.name != ENGINE_CONTAINER or c.list_name != "containers":
            if len(engines) == 1:
                problems.append(f"{where} starts vLLM; only the container named "
                                f"{ENGINE_CONTAINER} may")
            continue
        command = [str(w) for w in items(get(c.spec, "command"))]
        if command != engine_command():
            problems.append(f"{where}: its command is not the builder's start script (the gate, "
                            "fatal on failure, then `exec vllm serve` with the args shown): what "
                            "runs is not what the args and the gate policies see")
        args = [str(w) for w in items(get(c.spec, "args"))]
        model = args[0] if args else ""
        problems += [f"{where}: {p}" for p in _gate_env_problems(c, model)]
        problems += [f"{where}: {p}" for p in _probe_problems(c, _flag(args, "--port"))]
    return problems


def _serving(args: StackValidationArgs) -> list[tuple[PolicyResource, Workload]]:
    return [(res, wl) for res in args.resources
            for wl in workloads(res.resource_type, res.props)
            if any(_engine_processes(c) for c in wl.containers())]


def _engine_command(args: StackValidationArgs, report: ReportViolation) -> None:
    for res, wl in _serving(args):
        for problem in _command_problems(wl):
            report(f"{wl.kind} {wl.name}: {problem}", res.urn)


engine_command_policy = StackValidationPolicy(
    name="k3-engine-command",
    description=("The vLLM container runs exactly the builder's start script: the weights "
                 "gate on the tree it serves (the lock beside it, the shipped bootstrap and "
                 "runtime, a failure fatal), then `exec vllm serve` with the args the pod "
                 "spec shows; one engine per pod, probed on its own loopback /health. So "
                 f"every engine start loads the verified {_receipt().model.size_gb:g} GB tree with "
                 "the receipt's flags and env, not whatever a script says."),
    validate=_engine_command,
    enforcement_level=EnforcementLevel.MANDATORY,
)


# ---- exposure -------------------------------------------------------------------------

def _in_namespace(res: PolicyResource, namespace: str) -> bool:
    return str(get(res.props, "metadata", "namespace", default="default")) == namespace


def _proxy_ports(wl: Workload) -> tuple[set[int], set[str]]:
    numbers, names = set(), set()
    for c in wl.containers():
        if c.name == ENGINE_CONTAINER:
            continue
        for p in items(get(c.spec, "ports")):
            if as_int(get(p, "containerPort")) is not None:
                numbers.add(as_int(get(p, "containerPort")))
            if get(p, "name"):
                names.add(str(get(p, "name")))
    return numbers, names


def _engine_port(wl: Workload) -> Optional[int]:
    for c in wl.containers():
        if c.name == ENGINE_CONTAINER:
            port = _flag([str(w) for w in items(get(c.spec, "args"))], "--port")
            return int(port) if port and port.isdigit() else None
    return None


def _opens(rule_ports: list, engine_port: Optional[int]) -> bool:
    """A NetworkPolicy rule's ports admit the engine port (no ports: every port)."""
    if not rule_ports:
        return True
    for p in rule_ports:
        raw = get(p, "port")
        if raw is None:
            return True
        port, end = as_int(raw), as_int(get(p, "endPort"))
        if engine_port is not None and port is not None and (
                port == engine_port or (end is not None and port <= engine_port <= end)):
            return True
    return False


def _own_group(rule, labels: dict[str, str]) -> bool:
    """Every peer of an ingress rule is a pod of this same workload (same namespace)."""
    peers = items(get(rule, "from"))
    return bool(peers) and all(
        get(peer, "namespaceSelector") is None and get(peer, "ipBlock") is None
        and get(peer, "podSelector") is not None
        and mapping(get(peer, "podSelector", "matchLabels"))
        and label_selector_matches(get(peer, "podSelector"), labels) for peer in peers)


def _exposure_problems(args: StackValidationArgs, wl: Workload) -> list[str]:
    problems = []
    for c in wl.containers():
        if c.name == ENGINE_CONTAINER:
            host = _flag([str(w) for w in items(get(c.spec, "args"))], "--host")
            if host != ENGINE_HOST:
                problems.append(f"vLLM listens on {host!r}; it must listen on {ENGINE_HOST} "
                                "only, behind the authenticating proxy")
        for p in items(get(c.spec, "ports")):
            if get(p, "hostPort") is not None:
                problems.append(f"container {c.name} publishes hostPort {get(p, 'hostPort')}: "
                                "the node's address then reaches the pod around every Service "
                                "and NetworkPolicy")
    numbers, names = _proxy_ports(wl)
    engine_port = _engine_port(wl)
    labels = wl.labels()
    for res in args.resources:
        kind = kind_of(res.resource_type)
        if not _in_namespace(res, wl.namespace):
            continue
        name = get(res.props, "metadata", "name")
        if kind == "Service":
            selector = mapping(get(res.props, "spec", "selector"))
            if not selector or any(labels.get(str(k)) != str(v) for k, v in selector.items()):
                continue
            typ = get(res.props, "spec", "type", default="ClusterIP")
            if typ not in ("ClusterIP", None):
                problems.append(f"Service {name} is of type {typ}: it exposes the pods beyond "
                                "the cluster (the gateway or your ingress is the front door)")
            for p in items(get(res.props, "spec", "ports")):
                target = get(p, "targetPort", default=get(p, "port"))
                if not (as_int(target) in numbers or str(target) in names):
                    problems.append(f"Service {name} targets port {target!r}, not one of the "
                                    f"proxy's ({sorted(numbers)}): it reaches the engine "
                                    "around the API key check")
        elif kind == "NetworkPolicy":
            if not label_selector_matches(get(res.props, "spec", "podSelector"), labels):
                continue
            for rule in items(get(res.props, "spec", "ingress")):
                if _own_group(rule, labels):
                    continue        # a multi-node group's pods talk to each other (NCCL)
                if _opens(items(get(rule, "ports")), engine_port):
                    problems.append(f"NetworkPolicy {name} admits ingress to "
                                    f"{'every port' if not items(get(rule, 'ports')) else f'the engine port {engine_port}'}"
                                    " of the serving pods: only the proxy's ports may be open")
                    break
    return problems


def _engine_exposure(args: StackValidationArgs, report: ReportViolation) -> None:
    for res, wl in _serving(args):
        for problem in _exposure_problems(args, wl):
            report(f"{wl.kind} {wl.name}: {problem}", res.urn)


engine_exposure = StackValidationPolicy(
    name="k3-engine-exposure",
    description=(f"The raw engine is reachable from nowhere but its own pod: vLLM listens on "
                 f"{ENGINE_HOST}, no hostPort, no LoadBalancer or NodePort Service, no Service "
                 "aimed past the proxy's ports and no NetworkPolicy rule opening the engine "
                 f"port: every request to {_receipt().model.repo} passes the proxy's API key check."),
    validate=_engine_exposure,
    enforcement_level=EnforcementLevel.MANDATORY,
)


# ---- isolation ------------------------------------------------------------------------

def _root(wl: Workload, c: Container) -> bool:
    pod, own = mapping(get(wl.pod_spec, "securityContext")), mapping(get(c.spec, "securityContext"))
    uid = own.get("runAsUser", pod.get("runAsUser"))
    non_root = own.get("runAsNonRoot", pod.get("runAsNonRoot"))
    return as_int(uid) == 0 or non_root is not True


def _isolation_problems(args: StackValidationArgs, wl: Workload) -> list[str]:
    problems = []
    for res in args.resources:
        if kind_of(res.resource_type) == "Namespace" and \
                get(res.props, "metadata", "name") == wl.namespace:
            level = get(res.props, "metadata", "labels", "pod-security.kubernetes.io/enforce")
            if level != "restricted":
                problems.append(f"namespace {wl.namespace} enforces Pod Security {level!r}; "
                                "the serving namespace is `restricted`")
    for c in wl.containers():
        if _engine_processes(c) and _root(wl, c):
            problems.append(f"container {c.name} may run as root (runAsNonRoot is not true or "
                            "runAsUser is 0)")
    claims = {str(get(v, "persistentVolumeClaim", "claimName")) for v in wl.volumes().values()
              if get(v, "persistentVolumeClaim", "claimName")}
    claims |= {str(get(t, "metadata", "name")) for t in items(get(wl.metadata, "volumeClaimTemplates"))}
    pvcs = {str(get(r.props, "metadata", "name")): r for r in args.resources
            if kind_of(r.resource_type) == "PersistentVolumeClaim" and _in_namespace(r, wl.namespace)}
    for res in args.resources:
        if kind_of(res.resource_type) != "PersistentVolume" or get(res.props, "spec", "hostPath") is None:
            continue
        pv = str(get(res.props, "metadata", "name"))
        ref = get(res.props, "spec", "claimRef", "name")
        bound = [n for n, r in pvcs.items() if n in claims and
                 (get(r.props, "spec", "volumeName") == pv or ref == n)]
        if bound or get(res.props, "spec", "claimRef") is None:
            problems.append(f"PersistentVolume {pv} is a hostPath "
                            f"({get(res.props, 'spec', 'hostPath', 'path')!r})"
                            f"{' bound to ' + ', '.join(bound) if bound else ' any claim may bind'}: "
                            "the node's file system reaches the pod through a claim")
    return problems


def _engine_isolation(args: StackValidationArgs, report: ReportViolation) -> None:
    for res, wl in _serving(args):
        for problem in _isolation_problems(args, wl):
            report(f"{wl.kind} {wl.name}: {problem}", res.urn)


engine_isolation = StackValidationPolicy(
    name="k3-engine-isolation",
    description=(f"The engine stays in its sandbox whatever a pod spec says: the serving "
                 f"namespace enforces Pod Security `restricted`, the engine that holds "
                 f"{_receipt().measured_gpu.gpus_per_node} GPUs runs as non-root, "
                 "and no hostPath PersistentVolume is claimed by the serving pods (node-local "
                 "weights are `local` volumes)."),
    validate=_engine_isolation,
    enforcement_level=EnforcementLevel.MANDATORY,
)

POLICIES = [engine_command_policy, engine_exposure, engine_isolation]
