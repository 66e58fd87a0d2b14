"""Connection probes from real pods, for NetworkPolicies enforced on the node
(node.py's `network_policy=True`): each probe opens a TCP connection (and sends a GET) or
resolves a name from inside a running pod, through the exec API, and says what answered
or that nothing did. A probe expects an answer (allowed) or none (refused); a set of
probes is held to its expectations only once they agree twice in a row, the second
time all at once, since the controller applies a new pod's or policy's rules within
seconds, not at once.

    probes = [Probe(("ns", "client"), "API from an allowed namespace", ip, 8000, "api"),
              Probe(("ns", "other"), "API from elsewhere", ip, 8000, None), ...]
    report = settle(core, probes)        # AssertionError naming every probe that disagrees

Every pod a probe starts from needs bash and getent (Debian: the `proxy` test image).
"""
from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

REFUSED = "refused"
TIMEOUT_S = 3          # a policy drops: a refused connection is one that never opens


@dataclass(frozen=True)
class Probe:
    source: tuple[str, str]     # (namespace, pod) the probe runs in
    what: str                   # what it shows, for the report
    host: str                   # an address (http, tcp) or a DNS name (dns)
    port: int = 0
    expect: str | None = None   # the answer when allowed; None: refused
    kind: str = "http"          # http: GET /probe, last line of the answer; tcp: "open"
                                # once connected; dns: the address getent prints

    def command(self) -> str:
        if self.kind == "dns":
            return f"timeout {TIMEOUT_S} getent hosts {shlex.quote(self.host)} | cut -d' ' -f1"
        send = ('printf "GET /probe HTTP/1.0\\r\\nHost: probe\\r\\n\\r\\n" >&3; tail -n 1 <&3'
                if self.kind == "http" else "echo open")
        inner = f'exec 3<>/dev/tcp/{self.host}/{self.port} || exit 7; {send}'
        return f"timeout {TIMEOUT_S} bash -c {shlex.quote(inner)}"

    def line(self, answer: str) -> str:
        """The report's line: agreed or not, what was expected, from where, to what, got."""
        expected = "allowed" if self.expect is not None else "refused"
        return (f"{'ok  ' if answer == (self.expect or REFUSED) else 'FAIL'} "
                f"{expected:8} {self.source[0]}/{self.source[1]} -> "
                f"{self.host}{':' + str(self.port) if self.port else ''} ({self.what}): "
                f"got {answer!r}")


def exec_in(core, namespace: str, pod: str, script: str, container: str | None = None) -> str:
    """stdout of `bash -c script` in a running container (the exec API, as kubectl exec)."""
    from kubernetes.stream import stream

    kwargs = {"container": container} if container else {}
    resp = stream(core.connect_get_namespaced_pod_exec, pod, namespace,
                  command=["bash", "-c", script], stderr=True, stdin=False, stdout=True,
                  tty=False, _preload_content=False, **kwargs)
    resp.run_forever(timeout=TIMEOUT_S * 10)
    out = resp.read_stdout()
    resp.close()
    return out


def run_round(core, probes: list[Probe]) -> list[str]:
    """Every probe once, those of one pod at the same time (one exec per pod); the
    answer of each, REFUSED when nothing answered."""
    answers = [REFUSED] * len(probes)
    by_source: dict[tuple[str, str], list[int]] = {}
    for i, probe in enumerate(probes):
        by_source.setdefault(probe.source, []).append(i)
    for (namespace, pod), indexes in by_source.items():
        jobs = "\n".join(f"( a=$({probes[i].command()} 2>/dev/null); echo \"{i} ${{a:-{REFUSED}}}\" ) &"
                         for i in indexes)
        for line in exec_in(core, namespace, pod, jobs + "\nwait").splitlines():
            index, _, answer = line.partition(" ")
            if index.isdigit() and int(index) in indexes:
                answers[int(index)] = answer.strip() or REFUSED
    return answers


def settle(core, probes: list[Probe], timeout: float = 90.0) -> list[str]:
    """Run rounds until every probe agrees with its expectation, then once more (all must
    agree again); the report's lines. AssertionError with every line otherwise."""
    start = time.monotonic()
    rounds = 0
    while True:
        rounds += 1
        answers = run_round(core, probes)
        agree = all(a == (p.expect or REFUSED) for p, a in zip(probes, answers))
        if agree or time.monotonic() - start > timeout:
            break
        time.sleep(2)
    if agree:
        answers = run_round(core, probes)
        rounds += 1
    lines = [p.line(a) for p, a in zip(probes, answers)]
    summary = (f"{len(probes)} probes, {sum(p.expect is not None for p in probes)} allowed and "
               f"{sum(p.expect is None for p in probes)} refused expected; {rounds} rounds in "
               f"{time.monotonic() - start:.1f} s")
    if not all(a == (p.expect or REFUSED) for p, a in zip(probes, answers)):
        raise AssertionError(summary + ":\n" + "\n".join(lines))
    return [summary, *lines]
