"""Merge the build's registry credentials into one Docker config for BuildKit (the build
Job's `auth` init container, standard library only).

BuildKit reads a single config.json; the serving image's push Secret and the build
cache's (k3:engine.cacheRegistrySecret, its own repository) stay separate Secrets so
each can be scoped to one repository at the registry. A host in both is refused: one
config cannot hold two credentials for a host, and a silent choice would push with the
wrong one.

    python3 auth.py OUT_DIR CONFIG_JSON [CONFIG_JSON ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def merge(paths: list[Path]) -> dict:
    auths: dict[str, dict] = {}
    for path in paths:
        doc = json.loads(path.read_text())
        entries = doc.get("auths")
        if not isinstance(entries, dict) or not entries:
            raise ValueError(f"{path}: no `auths` (a kubernetes.io/dockerconfigjson Secret)")
        for host, entry in entries.items():
            if host in auths:
                raise ValueError(f"{path}: registry {host} has credentials in two Secrets; "
                                 "give the cache its own registry host or one Secret")
            auths[host] = entry
    return {"auths": auths}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: auth.py OUT_DIR CONFIG_JSON [CONFIG_JSON ...]", file=sys.stderr)
        return 2
    try:
        merged = merge([Path(p) for p in argv[1:]])
        out = Path(argv[0]) / "config.json"
        out.write_text(json.dumps(merged))
        out.chmod(0o400)
    except (OSError, ValueError) as exc:
        print(f"k3-engine auth: {exc}", file=sys.stderr)
        return 1
    print(f"k3-engine auth: {len(merged['auths'])} registry host(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
