"""`k3infra bench fetch`: copy a benchmark run from its results PVC through a short-lived
reader pod (k3infra.live.cluster reads the cluster), then check every file against the
run's SHA256SUMS on the local side."""
from __future__ import annotations

import base64
import binascii
import io
import json
import tarfile
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Optional

from k3infra.bench import manifests as b
from k3infra.podcommon import sha256_file


class FetchError(RuntimeError):
    """The run could not be fetched or does not match its SHA256SUMS."""


# --- evidence on the local side (pure file work, tested without a cluster) -------------

def unpack_run(payload_b64: str, out: Path) -> Path:
    """Extract the reader's base64 tar.gz into `out`; refuses links and escaping paths."""
    try:
        raw = base64.b64decode(payload_b64.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise FetchError("the reader returned no valid base64 archive") from None
    try:
        tar = tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz")
    except tarfile.TarError as exc:
        raise FetchError(f"the reader returned no valid archive ({exc})") from None
    roots = set()
    with tar:
        members = tar.getmembers()
        for m in members:
            p = PurePosixPath(m.name)
            if p.is_absolute() or ".." in p.parts or not (m.isfile() or m.isdir()):
                raise FetchError(f"refusing archive member {m.name!r}")
            roots.add(p.parts[0])
        if len(roots) != 1:
            raise FetchError(f"expected one run directory in the archive, got {sorted(roots)}")
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


def fetch_results(cluster: Any, namespace: str, out: Path, image: Optional[str] = None,
                  run_id: str = "", job_selector: Optional[str] = None,
                  enabled_by: str = "k3:benchmark.enabled") -> Path:
    """Copy the latest complete run (or `run_id`) from the results PVC into out/<run id>;
    returns that directory after checking every file against the run's SHA256SUMS.
    `cluster`: a k3infra.live.cluster.KubeCluster (benchmark_job, exec_reader). The Job
    found by `job_selector` (default: the benchmark's) names the claim; the AccuracySmoke
    Job keeps its runs the same way (/results/<run id>, LATEST)."""
    job = cluster.benchmark_job() if job_selector is None else cluster.benchmark_job(job_selector)
    if job is None:
        raise FetchError(f"no Job ({job_selector or b.COMPONENT}) in namespace {namespace}: "
                         f"enable {enabled_by} and run pulumi up")
    pod_spec = job["spec"]["template"]["spec"]
    claim = (job["metadata"].get("annotations") or {}).get("k3infra.dev/results-claim")
    if not claim:
        raise FetchError(f"Job {job['metadata']['name']} names no results claim")
    image = image or pod_spec["containers"][0]["image"]
    name = f"{job['metadata']['name']}-reader-{uuid.uuid4().hex[:6]}"
    payload = cluster.exec_reader(b.reader_pod(name, namespace, claim, image, pod_spec),
                                  b.export_command(run_id))
    run_dir = unpack_run(payload, out)
    problems = check_sums(run_dir)
    if problems:
        raise FetchError("fetched files do not match the run's SHA256SUMS: "
                           + "; ".join(problems))
    return run_dir
