"""Shared fixtures: offline renders of shipped stacks (cached per session) and the
receipt. Renders run the real stack program under the Pulumi SDK's mocks."""
from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import pytest

from k3infra.receipt import load_receipt
from k3infra.render import Render, render_stack

ROOT = Path(__file__).resolve().parent.parent


class _RefusedProgramFutures(logging.Filter):
    """The SDK's mocks leave futures and tasks behind a refused program (the tests that
    assert a refusal read it from the program's error); asyncio logs each at exit: 280
    tracebacks after the summary buried CI's log. Only these three messages are dropped."""

    NOISE = ("Future exception was never retrieved", "Task exception was never retrieved",
             "Task was destroyed but it is pending")

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.NOISE)


logging.getLogger("asyncio").addFilter(_RefusedProgramFutures())
# The suite asserts the shipped receipt: a K3INFRA_RECEIPT left in the shell must not
# choose another (tests that choose one set it themselves).
os.environ.pop("K3INFRA_RECEIPT", None)
ALL_STACKS = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in (ROOT / "stacks" / "examples").glob("Pulumi.*.yaml"))
# The one Docker-host stack (k3infra/host, tests/test_host.py); STACKS are the clusters.
HOST_STACKS = ["host"]
STACKS = [s for s in ALL_STACKS if s not in HOST_STACKS]
GOOD_REVISION = "3f1c2b4a5d6e7f8091a2b3c4d5e6f708192a3b4c"
# Shipped stacks build the engine in-cluster; these overrides switch one to an image the
# user already has (what `upstream` and the prebuilt cases need).
PREBUILT_IMAGE = "registry.example.com/k3/vllm-k3@sha256:" + "5e" * 32
PREBUILT = ('engine={"build": "prebuilt"}', f"engineImage={PREBUILT_IMAGE}")


@functools.lru_cache(maxsize=None)
def _render(stack: str, overrides: tuple[str, ...]) -> Render:
    return render_stack(stack, list(overrides), ROOT)


def render(stack: str = "existing", *overrides: str) -> Render:
    """A cached offline render of a shipped stack with `--config` overrides."""
    return _render(stack, tuple(overrides))


def manifest(r: Render, kind: str, name: str | None = None) -> dict:
    found = [m for m in r.manifests()
             if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container(r: Render, name: str = "vllm") -> dict:
    sts = manifest(r, "StatefulSet")
    return next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def runtime_configmap(r: Render) -> dict:
    """The weights runtime ConfigMap (its name carries a digest of its content)."""
    sts = manifest(r, "StatefulSet")
    vol = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "weights-runtime")
    return manifest(r, "ConfigMap", vol["configMap"]["name"])


@pytest.fixture(scope="session")
def receipt():
    return load_receipt()
