"""`k3infra bench fetch`: copy a benchmark run from its results PVC through a short-lived
reader pod (k3infra.live.cluster reads the cluster), then check every file against the
run's SHA256SUMS on the local side."""
from __future__ import annotations

import base64
import binascii
import io
import os
import stat
import tarfile
import uuid
import zlib
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Optional

from pydantic import AfterValidator, Field

from k3infra.bench import manifests as b
from k3infra.fileformats import (FileFormatError, FileModel, Text, load_json, load_sha256sums,
                                 relative_name)
from k3infra.podcommon import atomic_write, sha256_file


class FetchError(RuntimeError):
    """The run could not be fetched or does not match its SHA256SUMS."""


# --- evidence on the local side (pure file work, tested without a cluster) -------------

# The most a fetched run may unpack to (its result files are a few hundred MB at most):
# a decompression bomb from the reader pod stops here, before anything is written.
MAX_RUN_BYTES = 4 << 30
MAX_MEMBERS = 10_000


class _Set(FileModel):
    result: Annotated[str, AfterValidator(relative_name)]
    role: Text(64) = ""


class RunIndex(FileModel):
    """index.json of a benchmark run: the result file of each set and its role."""

    sets: list[_Set] = Field(default_factory=list, max_length=MAX_MEMBERS)


def _directory(out: Path, rel: PurePosixPath) -> Path:
    """out/rel as real directories (made as needed): an existing part that is a link or
    not a directory is refused, so nothing is written outside `out`."""
    here = out
    for part in rel.parts:
        here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            here.mkdir()
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise FetchError(f"{here}: exists and is not a directory (a link or a file); "
                             "nothing written there")
    return here


def unpack_run(payload_b64: str, out: Path) -> Path:
    """Extract the reader's base64 tar.gz into `out`; refuses links, escaping paths and
    more than MAX_RUN_BYTES; every file written by the one output writer."""
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
        try:
            members = tar.getmembers()
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise FetchError(f"the reader returned no valid archive ({exc})") from None
        if len(members) > MAX_MEMBERS:
            raise FetchError(f"the archive holds {len(members)} entries; at most {MAX_MEMBERS}")
        for m in members:
            p = PurePosixPath(m.name)
            if (p.is_absolute() or not p.parts or ".." in p.parts or not (m.isfile() or m.isdir())
                    or any(c in m.name for c in "\0\n\r\\")):
                raise FetchError(f"refusing archive member {m.name[:200]!r}")
            roots.add(p.parts[0])
        if len(roots) != 1:
            raise FetchError(f"expected one run directory in the archive, got {sorted(roots)[:10]}")
        total = sum(m.size for m in members if m.isfile())
        if total > MAX_RUN_BYTES:
            raise FetchError(f"the archive unpacks to {total} bytes; at most {MAX_RUN_BYTES}")
        out.mkdir(parents=True, exist_ok=True)
        for m in members:
            rel = PurePosixPath(m.name)
            if m.isdir():
                _directory(out, rel)
                continue
            where = _directory(out, rel.parent)
            try:
                data = tar.extractfile(m).read(m.size + 1)
            except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
                raise FetchError(f"the archive broke off at {m.name[:200]!r} ({exc})") from None
            try:
                atomic_write(where / rel.name, data)      # the one output writer
            except OSError as exc:
                raise FetchError(f"{exc.filename}: {exc.strerror}") from None
    return out / roots.pop()


def check_sums(run_dir: Path) -> list[str]:
    """Problems with the run's SHA256SUMS: missing file, wrong hash, unlisted file."""
    sums_path = run_dir / "SHA256SUMS"
    if not sums_path.is_file():
        return [f"{run_dir}: no SHA256SUMS"]
    try:
        listed = load_sha256sums(sums_path)
    except FileFormatError as exc:
        return [str(exc)]
    problems = []
    for rel, digest in listed.items():
        path = run_dir / rel
        try:
            actual = sha256_file(path)           # a regular file, no link followed
        except OSError:
            problems.append(f"{rel}: listed in SHA256SUMS, missing")
            continue
        if actual != digest:
            problems.append(f"{rel}: sha256 differs from SHA256SUMS")
    for path in sorted(run_dir.rglob("*")):
        rel = path.relative_to(run_dir).as_posix()
        if path.is_file() and rel not in listed and rel not in ("SHA256SUMS", "index.json"):
            problems.append(f"{rel}: not listed in SHA256SUMS")
    return problems


def measured_results(run_dir: Path) -> list[Path]:
    """The run's measured result files, from its index (warm-ups are not compared)."""
    index = load_json(Path(run_dir) / "index.json", "benchmark result", RunIndex,
                      follow_links=False)
    return [Path(run_dir) / s.result for s in index.sets if s.role == "measured"]


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
