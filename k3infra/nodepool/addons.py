"""Cluster add-ons as Helm releases, pinned in `charts/addons.yaml`.

Today that is the NVIDIA GPU Operator (>= 25.10.0, the first release that knows HGX
B300). The pin file and its values files are loaded and validated here: exact versions
only, values files that exist and hold only known keys. What must agree with the node
pool is set by code, never by a values file: driver/toolkit (off where the node image
ships them) and the operator's tolerations (from k3infra.placement).
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from k3infra import placement
from k3infra.nodepool.base import PoolSpec

PIN_FILE = "addons.yaml"
GPU_OPERATOR_MIN = (25, 10, 0)       # first GPU Operator release with HGX B300 support
_EXACT = re.compile(r"\Av?(\d+)\.(\d+)\.(\d+)\Z")


class AddonError(ValueError):
    """charts/ is inconsistent: names the file, the key and what is accepted."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ChartPin(_Strict):
    repo: str = Field(pattern=r"^https://")
    chart: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    version: str
    namespace: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    values: str
    provider_values: dict[Literal["aws", "oci", "nebius", "existing"], str] = Field(
        default_factory=dict, alias="providerValues")

    @field_validator("version")
    @classmethod
    def _exact(cls, v: str) -> str:
        if not _EXACT.match(v):
            raise ValueError(f"{v!r} is not an exact version (vMAJOR.MINOR.PATCH); "
                             "ranges and tags would let the install drift")
        return v

    def version_tuple(self) -> tuple[int, int, int]:
        return tuple(int(x) for x in _EXACT.match(self.version).groups())


class AddonPins(_Strict):
    gpu_operator: ChartPin = Field(alias="gpuOperator")


class _Enabled(_Strict):
    enabled: bool


class _Operator(_Strict):
    default_runtime: Literal["containerd", "crio", "docker"] = Field(alias="defaultRuntime")


class GpuOperatorValues(_Strict):
    """The GPU Operator keys a k3infra values file may set (anything else is a typo or
    belongs to code: driver, toolkit, daemonsets)."""

    gfd: Optional[_Enabled] = None
    nfd: Optional[_Enabled] = None
    device_plugin: Optional[_Enabled] = Field(default=None, alias="devicePlugin")
    dcgm_exporter: Optional[_Enabled] = Field(default=None, alias="dcgmExporter")
    mig_manager: Optional[_Enabled] = Field(default=None, alias="migManager")
    operator: Optional[_Operator] = None


def charts_dir() -> Path:
    """`charts/` of the checkout; another directory is passed explicitly
    (`ClusterAddons` args `chartsDir`), never through the environment."""
    return Path(__file__).resolve().parents[2] / "charts"


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise AddonError(f"{path}: cannot be read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise AddonError(f"{path}: is not valid YAML ({exc})") from None


def _first_error(path: Path, exc: ValidationError) -> AddonError:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = "is not a known key" if err["type"] == "extra_forbidden" else err["msg"]
    return AddonError(f"{path}: {key} = {err.get('input')!r}: {msg}")


def load_pins(root: Optional[Path] = None) -> AddonPins:
    root = root or charts_dir()
    path = root / PIN_FILE
    try:
        pins = AddonPins.model_validate(_load_yaml(path) or {})
    except ValidationError as exc:
        raise _first_error(path, exc) from None
    if pins.gpu_operator.version_tuple() < GPU_OPERATOR_MIN:
        raise AddonError(f"{path}: gpuOperator.version = {pins.gpu_operator.version!r}: "
                         f"HGX B300 needs GPU Operator "
                         f"v{'.'.join(map(str, GPU_OPERATOR_MIN))} or newer")
    return pins


def load_values(root: Path, relative: str) -> dict[str, Any]:
    path = root / relative
    data = _load_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AddonError(f"{path}: must be a mapping of chart values")
    try:
        GpuOperatorValues.model_validate(data)
    except ValidationError as exc:
        raise _first_error(path, exc) from None
    return data


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class HelmRelease:
    """One pinned chart with its final values (pure; registered by component.py)."""

    name: str
    repo: str
    chart: str
    version: str
    namespace: str
    values: dict[str, Any]


def gpu_operator_release(spec: PoolSpec, root: Optional[Path] = None) -> Optional[HelmRelease]:
    """The GPU Operator release for this pool, or None when the pool does not get one."""
    if not spec.gpu_operator:
        return None
    if spec.provider == "coreweave":
        raise AddonError("the NVIDIA GPU Operator is never installed on CoreWeave: CKS "
                         "manages the driver and device plugin")
    root = root or charts_dir()
    pin = load_pins(root).gpu_operator
    values = load_values(root, pin.values)
    extra = pin.provider_values.get(spec.provider)
    if extra is None:
        raise AddonError(f"{root / PIN_FILE}: gpuOperator.providerValues has no "
                         f"{spec.provider!r} entry")
    values = _merge(values, load_values(root, extra))
    # The node image decides who owns the driver; two drivers on one node never work.
    in_image = spec.sku.driver_in_image
    values = _merge(values, {
        "driver": {"enabled": not in_image},
        "toolkit": {"enabled": not in_image},
        "daemonsets": {"tolerations": placement.tolerations()},
    })
    return HelmRelease("gpu-operator", pin.repo, pin.chart, pin.version, pin.namespace, values)


def addon_releases(spec: PoolSpec, root: Optional[Path] = None) -> list[HelmRelease]:
    release = gpu_operator_release(spec, root)
    return [release] if release is not None else []
