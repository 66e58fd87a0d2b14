"""What the node stack (tests/e2e/test_node_stack.py) needs to pull the tiny model from an
S3 server through `pulumi up`, its weights' origin (`k3:weights.store`):

- `serve(node, root)`: the S3 server (versitygw, tools/testbed/s3server) listening on the
  node's address inside the test's network namespace, as the loopback Hub is served there
  (`hub_loopback.serve(..., host=node.ip)`); the prefetch pod reaches it like any store;
- `mirror(server, hub, lock_file)`: the product's `k3infra weights mirror` from the
  loopback Hub into it (the tree at <prefix>/<owner>--<name>/<revision>/, the lock beside);
- `secret(namespace)`, `store_config(server)` and `stack_keys(server)`: the credentials
  Secret the prefetch reads by reference, and the `k3:weights.store` keys the node stack
  sets (plain HTTP to the node's address is an explicit choice, its egress the node's /32);
- `tamper(server, repo, revision, path)` and `refusal(path)`: one byte of an object flipped in
  place (size and metadata kept; a second call flips it back), and the line the prefetch
  container then logs, naming the file (no marker is written, no serving pod starts on it).
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from store_servers import BUCKET, S3_KEYS, StoreServer, s3_server

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "models"
SECRET = "k3-store-keys"


def serve(node, root: Path) -> StoreServer:
    """Started; stop it with .stop() (or use it as a context manager)."""
    return s3_server(root, host=node.ip).start()


def url(server: StoreServer) -> str:
    return server.url(PREFIX)


def mirror(server: StoreServer, hub_env: dict, lock_file: Path) -> subprocess.CompletedProcess:
    """`k3infra weights mirror` of the lock's tree from the loopback Hub (hub_env:
    hub_loopback.environment) into the server; a second call uploads nothing."""
    return subprocess.run(
        [str(ROOT / ".venv/bin/k3infra"), "weights", "mirror", "--to", url(server),
         "--endpoint", server.endpoint, "--allow-http", "--region", "us-east-1",
         "--lock", str(lock_file)],
        env={**hub_env, **S3_KEYS}, capture_output=True, text=True, timeout=600)


def secret(namespace: str) -> dict:
    """The Secret `k3:weights.store.credentialsSecret` names (create it before the up)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SECRET, "namespace": namespace}, "stringData": dict(S3_KEYS)}


def store_config(server: StoreServer) -> dict:
    """`k3:weights.store` as the stack file holds it."""
    return {"url": url(server), "endpoint": server.endpoint, "allowHttp": True,
            "region": "us-east-1", "credentialsSecret": SECRET,
            "cidrs": [f"{server.host}/32"]}


def stack_keys(server: StoreServer) -> tuple:
    """`pulumi config set` argument tuples of the store the node stack reads: one per field
    (`--path k3:weights.store '{...}'` would store the JSON as one string, which the
    config refuses: "Input should be a valid dictionary")."""
    keys = []
    for field, value in store_config(server).items():
        for path, leaf in ([(f"{field}[{i}]", v) for i, v in enumerate(value)]
                           if isinstance(value, list) else [(field, value)]):
            keys.append(("--path", f"k3:weights.store.{path}",
                         str(leaf).lower() if isinstance(leaf, bool) else str(leaf),
                         # The CLI takes a key named *Secret with a value like
                         # "k3-store-keys" for a secret ("looks like a secret; rerun with
                         # --secret ... or --plaintext"): this one is a Secret's name.
                         *(("--plaintext",) if field == "credentialsSecret" else ())))
    return tuple(keys)


def object_path(server: StoreServer, repo: str, revision: str, path: str) -> Path:
    return server.object_file(f"{PREFIX}/{repo.replace('/', '--')}/{revision}/{path}")


def tamper(server: StoreServer, repo: str, revision: str, path: str, offset: int = 1000) -> None:
    """Flip one byte of the object in place: its size and k3sha256 metadata still claim
    the lock's file, so only hashing the bytes can tell."""
    with open(object_path(server, repo, revision, path), "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


def refusal(path: str) -> re.Pattern:
    """The prefetch Job's last word on a tampered object (stderr of `python3 -m k3weights
    prefetch`): the file named, its hash against the lock's, no marker."""
    return re.compile(rf"^  {re.escape(path)}: wrong hash: sha256 [0-9a-f]{{64}}, the lock says "
                      rf"[0-9a-f]{{64}} after 3 download\(s\); deleted$", re.M)


__all__ = ["BUCKET", "PREFIX", "SECRET", "serve", "url", "mirror", "secret", "store_config",
           "stack_keys", "tamper", "refusal", "object_path"]
