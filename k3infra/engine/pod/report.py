"""Write the engine build's result into its ConfigMap (the build Job's `report` container,
standard library only). Pulumi reads the ConfigMap back: the digest BuildKit pushed
becomes the serving StatefulSet's image.

Inputs: $K3_OUT/metadata.json (BuildKit's --metadata-file of pass 2) and
$K3_OUT/wheel/engine-wheel.json (pass 1's wheel record). Exit 0 once the ConfigMap
holds the result and reads back equal; non-zero (the Job fails, `pulumi up` stops)
on anything missing or malformed.
"""
from __future__ import annotations

import json
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

DIGEST = re.compile(r"\Asha256:[0-9a-f]{64}\Z")
SHA256 = re.compile(r"\A[0-9a-f]{64}\Z")
FULL_SHA = re.compile(r"\A[0-9a-f]{40}\Z")
ATTEMPTS = 5
MESSAGE_BYTES = 1800        # below the kubelet's 2048-byte termination message


class ReportError(Exception):
    pass


def result_data(metadata: dict, record: dict, repository: str) -> dict[str, str]:
    """The ConfigMap's data, from BuildKit's metadata and the wheel record."""
    digest = metadata.get("containerimage.digest", "")
    if not DIGEST.match(digest):
        raise ReportError(f"BuildKit metadata has no image digest (containerimage.digest={digest!r})")
    sha = record.get("sha256", "")
    commit = record.get("engine_commit", "")
    if not SHA256.match(sha):
        raise ReportError(f"wheel record has no sha256 ({sha!r})")
    if not FULL_SHA.match(commit):
        raise ReportError(f"wheel record has no full engine commit ({commit!r})")
    return {"digest": digest, "image": f"{repository}@{digest}", "wheelSha256": sha,
            "engineCommit": commit, "vllmVersion": record.get("version", ""),
            "wheel": record.get("wheel", "")}


def api_base() -> str:
    if os.environ.get("K3_API"):
        return os.environ["K3_API"].rstrip("/")
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def request(method: str, url: str, token: str, cafile: str | None, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/merge-patch+json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    context = ssl.create_default_context(cafile=cafile) if url.startswith("https:") else None
    last: Exception | None = None
    for attempt in range(ATTEMPTS):
        try:
            with urllib.request.urlopen(req, context=context, timeout=30) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code < 500:      # 4xx (RBAC, missing ConfigMap) will not heal
                raise ReportError(f"{method} {url}: HTTP {exc.code} {exc.read()[:300]!r}") from None
            last = exc
        except urllib.error.URLError as exc:
            last = exc
        time.sleep(min(2 ** attempt, 10))
    raise ReportError(f"{method} {url}: {last}")


def report(out: Path, api: str, namespace: str, name: str, repository: str, token: str,
           cafile: str | None) -> dict[str, str]:
    metadata = json.loads((out / "metadata.json").read_text())
    record = json.loads((out / "wheel" / "engine-wheel.json").read_text())
    data = result_data(metadata, record, repository)
    url = f"{api}/api/v1/namespaces/{namespace}/configmaps/{name}"
    # Data and immutability in one patch: the result is written once, by this Job.
    request("PATCH", url, token, cafile, {"data": data, "immutable": True})
    obj = request("GET", url, token, cafile)
    back = obj.get("data") or {}
    if any(back.get(k) != v for k, v in data.items()) or obj.get("immutable") is not True:
        raise ReportError(f"ConfigMap {namespace}/{name} reads back {back} "
                          f"(immutable={obj.get('immutable')}), wrote {data}")
    return data


def build_failure(out: Path) -> str | None:
    """The failed build's last lines (build.sh's build.failed), trimmed to what the
    kubelet keeps of a failed container's log as its termination message (2048 bytes
    or 80 lines): the newest lines are the ones that say why."""
    path = out / "build.failed"
    if not path.is_file():
        return None
    lines = path.read_text(errors="replace").splitlines()[-30:]
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        if len(line) > 300:         # BuildKit's error line quotes the whole RUN: keep both ends
            line = f"{line[:140]} ... {line[-150:]}"
        cost = len(line.encode()) + 1      # bytes, as the kubelet counts them
        if size + cost > MESSAGE_BYTES:
            break
        kept.insert(0, line)
        size += cost
    return "\n".join(kept)


def main() -> int:
    failed = build_failure(Path(os.environ.get("K3_OUT", "/k3/out")))
    if failed is not None:
        print(f"k3-engine report: the build failed; its last lines:\n{failed}", file=sys.stderr)
        return 1
    try:
        token_dir = Path(os.environ.get("K3_TOKEN_DIR", "/var/run/secrets/kubernetes.io/serviceaccount"))
        ca = token_dir / "ca.crt"
        data = report(Path(os.environ["K3_OUT"]), api_base(), os.environ["K3_NAMESPACE"],
                      os.environ["K3_RESULT_CONFIGMAP"], os.environ["K3_REPOSITORY"],
                      (token_dir / "token").read_text().strip(),
                      str(ca) if ca.is_file() else None)
    except (ReportError, OSError, KeyError, ValueError) as exc:
        print(f"k3-engine report: {exc}", file=sys.stderr)
        return 1
    print(f"k3-engine report: {data['image']} wheel sha256 {data['wheelSha256']} "
          f"engine {data['engineCommit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
