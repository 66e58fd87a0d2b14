"""`k3infra verify --docker-host`: the host's serving container, read through the Docker
API (the `docker` CLI with `-H`), in the shape `k3infra verify` compares with the receipt.

`docker inspect` of the server container becomes a one-replica StatefulSet-like dict:
the pin labels K3HostStack / compose.yaml set are its annotations, the `vllm serve`
arguments are the ones after the gate's `$0`, the env is the container's minus the gate's
K3_* inputs. Files (the verified marker, the lock) are read with `docker exec cat`.
"""
from __future__ import annotations

import subprocess
from typing import Any, Optional

from k3infra.host.plan import SERVER, container_name
from k3infra.live.cluster import READ_MAX_BYTES, READ_SCRIPT, ClusterError
from k3infra.podcommon import JsonRefused, parse_json
from k3infra.serve_argv import serve_args_of

GATE_ENV_PREFIX = "K3_"


def statefulset_view(inspect: dict) -> dict:
    """One `docker inspect` object -> the StatefulSet-like dict `k3infra verify` reads."""
    config = inspect.get("Config") or {}
    argv = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    args = serve_args_of(argv)
    env: list[dict[str, Any]] = []
    for entry in config.get("Env") or []:
        name, _, value = entry.partition("=")
        if name.startswith(GATE_ENV_PREFIX):
            continue
        if name == "VLLM_API_KEY":
            # Set from a Pulumi secret or a Compose env file: never shown, never compared.
            env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": "docker-env",
                                                                     "key": name}}})
        else:
            env.append({"name": name, "value": value})
    health = ((inspect.get("State") or {}).get("Health") or {}).get("Status")
    return {"metadata": {"name": (inspect.get("Name") or SERVER).lstrip("/"),
                         "annotations": dict(config.get("Labels") or {})},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{
                "name": "vllm", "image": config.get("Image"),
                "command": ["vllm", "serve"] if args is not None else argv,
                "args": args or [], "env": env}]}}},
            "status": {"readyReplicas": 1 if health == "healthy" else 0}}


class DockerHost:
    """What `verify_rows` needs, from one Docker daemon (`docker -H HOST`): the serving
    container of `instance` (`<instance>-vllm`, the name K3HostStack and compose.yaml
    give it)."""

    namespace = "(docker host)"

    def __init__(self, host: str, instance: str, docker: str = "docker"):
        self.host, self.docker = host, docker
        self.container = container_name(instance, SERVER)

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([self.docker, "-H", self.host, *args], capture_output=True,
                                  text=True, errors="replace", timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ClusterError(f"docker -H {self.host}: {exc}") from None

    def statefulset(self) -> dict:
        done = self._run("inspect", self.container)
        if done.returncode != 0:
            raise ClusterError(f"docker -H {self.host} inspect {self.container}: "
                               f"{done.stderr.strip()[:500]}")
        try:     # podcommon's bounded JSON parser: what the daemon says is data, not trusted
            found = parse_json(done.stdout)
        except JsonRefused as exc:
            raise ClusterError(f"docker -H {self.host} inspect {self.container}: {exc}") from None
        if not isinstance(found, list) or not found or not isinstance(found[0], dict):
            raise ClusterError(f"docker -H {self.host} inspect {self.container}: not a "
                               "container's JSON")
        return statefulset_view(found[0])

    def read_file(self, pod: str, container: str, path: str) -> Optional[str]:
        # The bounded reader's rule inside the container (live.cluster.READ_SCRIPT): a
        # FIFO or a link to /dev/zero on the volume never hangs or floods this process.
        done = self._run("exec", self.container, "python3", "-c", READ_SCRIPT, path,
                         str(READ_MAX_BYTES))
        if done.returncode == 4:
            raise ClusterError(f"{path} in {self.container} is not a regular file of at most "
                               f"{READ_MAX_BYTES} bytes (a link, a FIFO, a device or larger)")
        return done.stdout if done.returncode == 0 else None
