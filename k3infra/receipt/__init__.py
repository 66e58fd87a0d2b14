"""The measured serving receipt as data: a YAML file shipped in the package and the
pydantic model that refuses a malformed one.

Every pin (engine commit, serve flags, weights digest, figures) is read from here; no
other module repeats a receipt value as a literal.

Which receipt a process judges against is chosen in one place, `load_receipt()`'s
default: the file named by the environment variable K3INFRA_RECEIPT, else the shipped
one. The program, its render, the policy pack (its own process, launched by the Pulumi
CLI, which inherits the environment), `verify`, `bench` and the plugin all read it so.
"""
from __future__ import annotations

import functools
import os
from importlib import resources
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from k3infra.fieldtypes import SHA256_DIGEST, Sha256Hex

RECEIPT_FILE = "kimi-k3-8xb300-2026-07-29.yaml"
RECEIPT_ENV = "K3INFRA_RECEIPT"
_DIGEST = SHA256_DIGEST.anchored


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hardware(_Strict):
    node: str
    gpu_product_label: str
    gpu_memory_bytes: int = Field(gt=0)
    compute_capability: str
    driver_branch_min: int


class Model(_Strict):
    repo: str
    quantization: str
    revision: Optional[str] = None
    shards: int = Field(gt=0)
    shard_format: str
    size_gb: float = Field(gt=0)
    tree_digest: str
    tree_digest_algorithm: Optional[str] = None
    total_params: str
    active_params_per_token: str
    routed_experts: int
    active_experts: int
    shared_experts: int
    moe_layers: int
    attention: str
    vision_tower: str
    max_context: str

    @field_validator("tree_digest")
    @classmethod
    def _digest_form(cls, v: str) -> str:
        if not _DIGEST.match(v):
            raise ValueError(f"tree_digest {v!r} is not of the form sha256:<64 hex>")
        return v

    @property
    def size_bytes(self) -> int:
        return int(self.size_gb * 1e9)


class Engine(_Strict):
    name: str
    version: str
    repo: str
    commit: str = Field(pattern=r"^[0-9a-f]{7,40}$")
    pull_request: int
    build_exclusions: list[str]
    cuda_arch: str

    def is_commit(self, value: object) -> bool:
        """`value` names the receipt's engine: its commit, or a longer one starting with it
        (the full 40-hex commit a build takes, `k3:engine.commit`)."""
        return (isinstance(value, str) and len(value) in range(len(self.commit), 41)
                and all(c in "0123456789abcdef" for c in value) and value.startswith(self.commit))


class EngineArg(_Strict):
    flag: str = Field(pattern=r"^--[a-z0-9-]+$")
    value: Optional[str] = None
    why: str

    def tokens(self) -> list[str]:
        return [self.flag] if self.value is None else [self.flag, self.value]


class EnvVar(_Strict):
    name: str = Field(pattern=r"^[A-Z_][A-Z0-9_]*$")
    value: str
    why: str


class SurfaceArg(_Strict):
    flag: str = Field(pattern=r"^--[a-z0-9-]+$")
    takes_value: bool


class Surface(_Strict):
    args: list[SurfaceArg]
    env: list[str]


class Serve(_Strict):
    engine_args: list[EngineArg] = Field(min_length=1)
    engine_env: list[EnvVar]
    surface: Surface

    @model_validator(mode="after")
    def _disjoint(self) -> "Serve":
        engine_flags = {a.flag for a in self.engine_args}
        if len(engine_flags) != len(self.engine_args):
            raise ValueError("serve.engine_args repeats a flag")
        clash = engine_flags & {a.flag for a in self.surface.args}
        clash |= {e.name for e in self.engine_env} & set(self.surface.env)
        if clash:
            raise ValueError(f"serve: {sorted(clash)} are both engine path and surface")
        return self

    def engine_arg_tokens(self) -> list[str]:
        """The measured `vllm serve` flags, flattened, in receipt order."""
        return [t for a in self.engine_args for t in a.tokens()]

    def engine_env_map(self) -> dict[str, str]:
        return {e.name: e.value for e in self.engine_env}

    def surface_flag(self, flag: str) -> Optional[SurfaceArg]:
        return next((a for a in self.surface.args if a.flag == flag), None)


class Residency(_Strict):
    weights_gib_per_gpu: float = Field(gt=0)


class WideSweep(_Strict):
    """The sweep that ran past the published grid (its raw files were lost)."""

    concurrencies: list[int] = Field(min_length=1)
    output_tokens_max: int = Field(gt=0)


class WorkloadA(_Strict):
    description: str
    prompt_tokens_min: int = Field(gt=0)
    prompt_tokens_max: int = Field(gt=0)
    output_tokens_max: int = Field(gt=0)
    concurrencies: list[int] = Field(min_length=1)
    warmup_requests: int = Field(ge=0)
    measured_requests: int = Field(gt=0)
    runs_agreement_pct: float
    throughput_unit: str
    wide_sweep: Optional[WideSweep] = None

    @model_validator(mode="after")
    def _range(self) -> "WorkloadA":
        if self.prompt_tokens_min > self.prompt_tokens_max:
            raise ValueError("workload_a: prompt_tokens_min > prompt_tokens_max")
        return self


class Measurement(_Strict):
    concurrency: int = Field(gt=0)
    metric: Literal["e2el", "ttft", "tpot", "itl"]
    p50_ms: float = Field(gt=0)
    p99_ms: float = Field(gt=0)


class Evidence(_Strict):
    """A raw result file behind the measured figures, by hash (`k3infra bench receipt`)."""

    file: str
    sha256: Sha256Hex
    concurrency: Optional[int] = Field(default=None, gt=0)
    role: Literal["warmup", "measured"] = "measured"


class AccuracyScore(_Strict):
    task: str
    metric: str
    score: float = Field(ge=0, le=1)
    samples: int = Field(gt=0)


class AccuracyFile(_Strict):
    file: str
    sha256: Sha256Hex


class AccuracyBaseline(_Strict):
    """The first accepted accuracy smoke test (`k3infra accuracy compare --accept`):
    a smoke test of the endpoint, not a benchmark claim about the model."""

    label: Literal["smoke test"]
    run_id: str
    harness: str                       # e.g. lm-eval 0.4.13
    task_config: dict
    scores: list[AccuracyScore] = Field(min_length=1)
    files: list[AccuracyFile] = Field(min_length=1)
    engine: dict
    weights: dict


class GpuSpec(_Strict):
    memory_gib: Optional[float] = Field(default=None, gt=0)
    free_gib: Optional[float] = Field(default=None, gt=0)
    gpus_per_node: int = Field(gt=0)


class LicenseSection(_Strict):
    section: int
    text: str


class License(_Strict):
    name: str
    commercial_use: str
    sections: list[LicenseSection]
    gated_note: str

    def thresholds_text(self) -> str:
        return "; ".join(f"Section {s.section}: {s.text}" for s in self.sections)


class Receipt(_Strict):
    schema_: Literal["k3infra.receipt/v1"] = Field(alias="schema")
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    measured_on: str
    hardware: Hardware
    model: Model
    engine: Engine
    serve: Serve
    residency: Residency
    workload_a: WorkloadA
    measured: list[Measurement]
    evidence: list[Evidence] = Field(default_factory=list)
    accuracy: Optional[AccuracyBaseline] = None
    not_measured: list[str] = Field(min_length=1)
    gpus: dict[str, GpuSpec]
    license: License

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _measured_gpu_known(self) -> "Receipt":
        if self.hardware.gpu_product_label not in self.gpus:
            raise ValueError(f"hardware.gpu_product_label {self.hardware.gpu_product_label!r} "
                             f"is not in gpus: {sorted(self.gpus)}")
        return self

    @property
    def measured_gpu(self) -> GpuSpec:
        return self.gpus[self.hardware.gpu_product_label]

    def measurement(self, concurrency: int, metric: str = "e2el") -> Optional[Measurement]:
        return next((m for m in self.measured
                     if m.concurrency == concurrency and m.metric == metric), None)


class ReceiptError(ValueError):
    """A receipt file that cannot be read or is not a k3infra.receipt/v1 document: one
    line naming the file and the problem."""


def parse_receipt(data: dict) -> Receipt:
    return Receipt.model_validate(data)


def receipt_path() -> Path:
    """The shipped receipt."""
    return Path(str(resources.files(__name__).joinpath(RECEIPT_FILE)))


def chosen_receipt_path() -> Path:
    """The receipt this process judges against: $K3INFRA_RECEIPT, else the shipped one."""
    chosen = os.environ.get(RECEIPT_ENV, "").strip()
    return Path(chosen) if chosen else receipt_path()


def load_receipt(path: Optional[str] = None) -> Receipt:
    """The receipt at `path`; without one, the chosen receipt (chosen_receipt_path).
    Read each time it is asked for, so a change of K3INFRA_RECEIPT is seen; each file is
    parsed once."""
    where = Path(path) if path else chosen_receipt_path()
    if path is None and os.environ.get(RECEIPT_ENV, "").strip():
        where_named = f"{where} (from {RECEIPT_ENV})"
    else:
        where_named = str(where)
    return _load(str(where), where_named)


@functools.lru_cache(maxsize=None)
def _load(path: str, named: str) -> Receipt:
    from pydantic import ValidationError

    from k3infra.fileformats import FileFormatError, load_yaml

    try:    # the bounded reader and the strict YAML loader (issue 48)
        data = load_yaml(path, "receipt")
    except FileFormatError as exc:
        raise ReceiptError(f"receipt {named}: {exc.problem}") from None
    if not isinstance(data, dict):
        raise ReceiptError(f"receipt {named}: not a mapping (a k3infra.receipt/v1 document)") from None
    try:
        return parse_receipt(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg']}"
                             for e in exc.errors())
        raise ReceiptError(f"receipt {named}: {problems}") from None
