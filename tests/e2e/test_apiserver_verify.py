"""`k3infra verify` (the CLI, as a user runs it) against the live objects `pulumi up`
created on the real API server (tests/e2e/apiserver.py), before and after a serve flag
is changed through the API.

No kubelet runs: the serving pod exists (the StatefulSet controller creates it) but is
never scheduled, so nothing can be read inside it and no replica is ready. `--lock`
supplies the lock verify would otherwise read from the weights volume and `--no-results`
skips the benchmark (no Job ever ran). The checks that need a running pod (the verified
marker, ready replicas) fail for that reason, in the table; every check the API server
answers - the StatefulSet against the receipt - holds, until the patch. (Before the fix
this test prompted, the Pending pod made verify exit 2 with no table at all.)
"""

from __future__ import annotations

import os
import subprocess

import pytest

from engine import ROOT, Pulumi
from engine import testbed_bin, project, pulumi, pulumi_home  # noqa: F401  (fixtures)
from test_apiserver_stack import INSTANCE_LABEL, kube, on_server, use_test_program  # noqa: F401

pytest_plugins = ["apiserver"]
pytestmark = pytest.mark.e2e

# The checks that need the serving pod running: its ready condition, and the verified
# marker read inside it (a Pending pod has no host to exec in).
NEEDS_A_RUNNING_POD = ("ready replicas", "verified marker")


def verify(cluster, namespace: str, lock, cwd) -> subprocess.CompletedProcess:
    """`k3infra verify` with the cluster's admin kubeconfig, its table on one line a row."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env.update(cluster.env(), COLUMNS="200", NO_COLOR="1")
    argv = [str(ROOT / ".venv/bin/k3infra"), "verify", "--namespace", namespace,
            "--lock", str(lock), "--no-results"]
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    print(f"\n$ KUBECONFIG={cluster.kubeconfig} {' '.join(argv[1:])}    "
          f"[exit {proc.returncode}]")
    for line in (proc.stdout + proc.stderr).rstrip().splitlines():
        print(f"    {line}")
    return proc


def rows(out: str, verdict: str) -> list[str]:
    """The table's rows whose last cell is `verdict` (ok or DRIFT), each as one line: rich
    folds a long cell onto continuation lines (those with an empty first cell)."""
    table: list[list[str]] = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if "│" not in line or len(cells) != 5:
            continue
        if cells[0] or not table:
            table.append(cells)
        else:
            table[-1] = [" ".join(filter(None, pair)) for pair in zip(table[-1], cells)]
    return [" │ ".join(cells) for cells in table if cells[-1] == verdict]


def test_verify_reads_the_live_objects_then_names_a_patched_flag(on_server: Pulumi, kube, cluster,
                                                                  tmp_path):
    dyn, _core = kube
    use_test_program(on_server).run("up", "--yes", show=10)
    sts_api = dyn.resources.get(api_version="apps/v1", kind="StatefulSet")
    (sts,) = sts_api.get(label_selector=INSTANCE_LABEL).items
    namespace, name = sts.metadata.namespace, sts.metadata.name
    # A whole lock (verify reads it through the one lock reader, its digest recomputed) of
    # a stand-in tree: the checks that compare it need the marker inside the running pod.
    from k3infra.weights import tree
    from k3infra.weights.verify import lock_from_dir

    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "config.json").write_text("{}\n")
    lock = tmp_path / "lock.json"
    lock.write_text(tree.lock_to_json(lock_from_dir(str(tmp_path / "tree"), "moonshotai/Kimi-K3",
                                                    "3f" * 20)))

    # Every check the server can answer holds; only those needing a running pod fail.
    before = verify(cluster, namespace, lock, on_server.cwd)
    assert before.returncode == 1, before.stderr
    bad = rows(before.stdout, "DRIFT")
    assert len(bad) == 2 and all(any(c in row for c in NEEDS_A_RUNNING_POD) for row in bad), bad
    assert f"verified marker [{name}-0]" in "".join(bad)  # the pod, named
    assert "does not have a host assigned" in "".join(bad)  # the server's reason
    assert any("engine args" in row for row in rows(before.stdout, "ok"))

    args = list(sts.spec.template.spec.containers[0].args)
    i = args.index("--block-size")
    args[i + 1] = "64" if args[i + 1] != "64" else "32"
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}]
    sts_api.patch(name=name, namespace=namespace, body=patch,
                  content_type="application/json-patch+json", field_manager="e2e-verify")

    after = verify(cluster, namespace, lock, on_server.cwd)
    assert after.returncode == 1, after.stderr
    bad = rows(after.stdout, "DRIFT")
    flagged = [row for row in bad if "engine args" in row]
    assert len(bad) == 3 and flagged, bad
    assert f"--block-size {args[i + 1]}" in flagged[0], flagged
    on_server.run("destroy", "--yes", show=5)
