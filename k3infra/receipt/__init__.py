"""Serving receipts as data: YAML files shipped in the package (or kept in your Pulumi
project) and the pydantic model that refuses a malformed one.

Every pin (engine commit or image, serve flags, weights digest, figures) is read from a
receipt; no other module repeats a receipt value as a literal. A receipt is `measured`
(figures from a benchmark run) or a `candidate` (a flag set to try, nothing measured
yet: `k3infra bench receipt` turns a run of it into a measured one).

Which receipt a stack is judged against is the stack's own choice, `k3:receipt`: a
shipped receipt's id or a file inside the Pulumi project (`stack_receipt()`, the one
resolver the program, the render, the policy pack and every CLI command use). The
environment variable K3INFRA_RECEIPT stays only as a test override: used where the stack
names none, refused in one line where it disagrees with the stack's key.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from k3infra.fieldtypes import SHA256_DIGEST, Sha256Hex
from k3infra.fileformats import FileFormatError, decode_text, read_bytes

# The receipt a stack runs when it names none (`k3:receipt` unset): the measured one.
DEFAULT_RECEIPT = "kimi-k3-8xb300-2026-07-29"
RECEIPT_FILE = f"{DEFAULT_RECEIPT}.yaml"
RECEIPT_ENV = "K3INFRA_RECEIPT"
RECEIPT_KEY = "k3:receipt"
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
    """The engine: built from a commit (`commit`, the measured receipt's), or a released
    image (`image`, by tag: the stack pins its digest in k3:engineImage with `k3infra
    pins`). Exactly one of the two."""

    name: str
    version: str
    repo: str
    commit: Optional[str] = Field(default=None, pattern=r"^[0-9a-f]{7,40}$")
    # By tag (a candidate: the stack pins the digest), or tag@digest once measured.
    image: Optional[str] = Field(
        default=None, pattern=r"^[a-z0-9][a-z0-9.:/_-]*:[A-Za-z0-9_.-]+(@sha256:[0-9a-f]{64})?$")
    pull_request: int = 0
    build_exclusions: list[str] = Field(default_factory=list)
    cuda_arch: str

    @model_validator(mode="after")
    def _one_source(self) -> "Engine":
        if (self.commit is None) == (self.image is None):
            raise ValueError("engine: exactly one of commit (a build) and image (a released "
                             "image by tag) is needed")
        return self

    @property
    def image_repository(self) -> Optional[str]:
        """A released engine's repository (`image` without its tag)."""
        return image_repository(self.image) if self.image else None

    def describe(self) -> str:
        """`vLLM <version> @ <commit>` or `vLLM <version>, image <ref>`: the one wording."""
        name = "vLLM" if self.name == "vllm" else self.name
        return (f"{name} {self.version} @ {self.commit}" if self.commit else
                f"{name} {self.version}, image {self.image}")

    def is_commit(self, value: object) -> bool:
        """`value` names the receipt's engine: its commit, or a longer one starting with it
        (the full 40-hex commit a build takes, `k3:engine.commit`)."""
        return (self.commit is not None and isinstance(value, str)
                and len(value) in range(len(self.commit), 41)
                and all(c in "0123456789abcdef" for c in value) and value.startswith(self.commit))


def image_repository(ref: str) -> str:
    """`registry/repo[:tag][@digest]` -> `registry/repo` (a registry's port is kept)."""
    name = ref.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


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


class KvCache(_Strict):
    """An upper bound of the KV cache's bytes per token on each GPU, and what it rests on:
    the HBM preflight holds `--max-model-len` to it (k3infra.hbm.context_fit)."""

    dtype: str
    bytes_per_token_max: int = Field(gt=0)
    basis: str


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
    # 0.00 ms is a real inter-token gap: tokens that arrive in one streamed chunk (found
    # by a benchmark of the CPU engine: its c=1 ITL median was 0.0037 ms). A request's
    # end-to-end latency never is.
    p50_ms: float = Field(ge=0)
    p99_ms: float = Field(ge=0)

    @model_validator(mode="after")
    def _e2el_positive(self) -> "Measurement":
        if self.metric == "e2el" and min(self.p50_ms, self.p99_ms) <= 0:
            raise ValueError("e2el p50_ms and p99_ms must be greater than 0")
        return self


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
    # `candidate`: a flag set to try, nothing measured yet (no figures, no evidence);
    # `source` says where its flags come from.
    status: Literal["measured", "candidate"] = "measured"
    source: Optional[str] = None
    measured_on: Optional[str] = None
    hardware: Hardware
    model: Model
    engine: Engine
    serve: Serve
    residency: Residency
    kv_cache: Optional[KvCache] = None
    workload_a: WorkloadA
    measured: list[Measurement] = Field(default_factory=list)
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

    @model_validator(mode="after")
    def _status_holds(self) -> "Receipt":
        if self.status == "measured" and not (self.measured and self.measured_on):
            raise ValueError("status measured: needs measured_on and at least one measured "
                             "figure (a receipt with none is a candidate)")
        if self.status == "candidate" and (self.measured or self.evidence):
            raise ValueError("status candidate: measured and evidence must be empty (`k3infra "
                             "bench receipt` turns a run of it into a measured receipt)")
        if self.status == "candidate" and not self.source:
            raise ValueError("status candidate: source (where its flags come from) is needed")
        return self

    def sha256(self) -> str:
        """The receipt's identity: sha256 of its content (canonical JSON, so comments and
        layout do not count), recorded on the workloads and in the stack outputs."""
        doc = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True,
                         separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(doc.encode()).hexdigest()

    def identity(self) -> dict[str, str]:
        """id, content sha256 and status, as plan.json and `receipt diff --json` record them."""
        return {"id": self.id, "sha256": self.sha256(), "status": self.status}

    @property
    def is_candidate(self) -> bool:
        return self.status == "candidate"

    def standing(self) -> str:
        """How this receipt stands, in the words every view uses."""
        if self.is_candidate:
            return f"candidate: {NOTHING_MEASURED}"
        return f"measured {self.measured_on}"

    @property
    def measured_gpu(self) -> GpuSpec:
        return self.gpus[self.hardware.gpu_product_label]

    def measurement(self, concurrency: int, metric: str = "e2el") -> Optional[Measurement]:
        return next((m for m in self.measured
                     if m.concurrency == concurrency and m.metric == metric), None)


# What a candidate shows wherever a measured receipt shows its figures.
NOTHING_MEASURED = "nothing measured yet"


class ReceiptError(ValueError):
    """A receipt file that cannot be read or is not a k3infra.receipt/v1 document: one
    line naming the file and the problem."""


def parse_receipt(data: dict) -> Receipt:
    return Receipt.model_validate(data)


def problems(exc: ValidationError) -> str:
    """A receipt's validation errors on one line, each with its field's path."""
    return "; ".join(f"{'.'.join(str(x) for x in e['loc']) or '(top)'}: "
                     f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())


def receipt_path() -> Path:
    """The shipped default receipt (the measured one)."""
    return shipped_receipts()[DEFAULT_RECEIPT]


def shipped_receipts() -> dict[str, Path]:
    """Every receipt shipped in the package, by id (its file's stem)."""
    here = Path(str(resources.files(__name__)))
    return {p.stem: p for p in sorted(here.glob("*.yaml"))}


@dataclass(frozen=True)
class ChosenReceipt:
    """A receipt with where it came from: what the stack (or a flag) named, the file, its
    sha256 (recorded on the workloads and in the stack outputs), and who chose it."""

    receipt: Receipt
    name: str           # as named: a shipped id or a path inside the project
    path: Path
    chosen_by: str      # "k3:receipt", "K3INFRA_RECEIPT", "--receipt", or "default"

    @property
    def sha256(self) -> str:
        return self.receipt.sha256()

    def record(self) -> dict[str, str]:
        return {**self.receipt.identity(), "name": self.name}


def _read(path: Path, named: str) -> Receipt:
    try:      # the one bounded reader: a FIFO, a device or a huge file is refused
        raw = read_bytes(path, "receipt")
    except FileFormatError as exc:
        raise ReceiptError(f"receipt {named}: {exc.problem}") from None
    return _parse(raw, str(path), named)


def named_receipt_path(name: str, root: Path, what: str = RECEIPT_KEY) -> Path:
    """The file `name` stands for: a shipped receipt's id, or a `.yaml` file inside the
    project at `root` (a relative path with no `..`, so the program, the render and the
    policy pack, each from its own directory, find the same file)."""
    shipped = shipped_receipts()
    if name in shipped:
        return shipped[name]
    rel = PurePosixPath(name)
    if (not name or name != name.strip() or rel.is_absolute() or ".." in rel.parts
            or rel.suffix not in (".yaml", ".yml")):
        raise ReceiptError(f"{what} = {name!r}: not a shipped receipt ({', '.join(shipped)}) "
                           "nor a .yaml file inside the Pulumi project (a relative path "
                           "without '..')")
    return root / rel


def stack_receipt(name: Optional[str], root: Optional[Path] = None,
                  chosen_by: str = RECEIPT_KEY) -> ChosenReceipt:
    """The receipt a stack is judged against: `name` (its k3:receipt, or a flag naming a
    receipt) resolved in the project at `root` (default: the working directory, where
    `pulumi` runs the program). K3INFRA_RECEIPT, a test override, is used where nothing is
    named and refused where it names another file's bytes."""
    root = root if root is not None else Path.cwd()
    env = os.environ.get(RECEIPT_ENV, "").strip()
    override = None
    if env:
        override = ChosenReceipt(_read(Path(env), f"{env} (from {RECEIPT_ENV})"), env, Path(env),
                                 RECEIPT_ENV)
    if not name:
        if override is not None:
            return override
        return ChosenReceipt(_read(receipt_path(), str(receipt_path())), DEFAULT_RECEIPT,
                             receipt_path(), "default")
    path = named_receipt_path(name, root, chosen_by)
    chosen = ChosenReceipt(_read(path, f"{path} ({chosen_by} = {name})"), name, path, chosen_by)
    if override is not None and override.sha256 != chosen.sha256:
        raise ReceiptError(f"{chosen_by} = {name} (receipt {chosen.receipt.id}, sha256 "
                           f"{chosen.sha256[:12]}) and {RECEIPT_ENV} = {env} (receipt "
                           f"{override.receipt.id}, sha256 {override.sha256[:12]}) disagree: the "
                           f"stack's key decides; unset {RECEIPT_ENV} (a test override)")
    return chosen


def receipt_named(value: str, flag: str = "--receipt") -> ChosenReceipt:
    """A receipt a command line names: a shipped receipt's id, or a file anywhere (as typed)."""
    shipped = shipped_receipts()
    path = shipped.get(value) or Path(value)
    return ChosenReceipt(_read(path, f"{value} ({flag})" if value in shipped else value),
                         value, path, flag)


def load_receipt(path: Optional[str] = None) -> Receipt:
    """The receipt in the file at `path`; without one, the receipt of a stack that names
    none (stack_receipt(None): $K3INFRA_RECEIPT, else the shipped default). Each file is
    parsed once."""
    if path:
        return _read(Path(path), path)
    return stack_receipt(None).receipt


@functools.lru_cache(maxsize=None)
def _parse(raw: bytes, path: str, named: str) -> Receipt:
    """A receipt from its bytes (cached by them: an edited file is parsed again)."""
    # yaml here, not at the top: 0.04 s to import (python -X importtime), which `k3infra
    # startup` (it loads this module, never a receipt file) does not pay.
    import yaml

    # Here, not at the top: an import cycle (k3infra.config imports this module).
    from k3infra.config.stackfile import StackFileError, strict_yaml

    try:    # the strict YAML loader of the stack files (issue 48)
        data = strict_yaml(decode_text(raw, path, "receipt"), Path(path))
    except FileFormatError as exc:
        raise ReceiptError(f"receipt {named}: {exc.problem}") from None
    except StackFileError as exc:
        raise ReceiptError(f"receipt {named}: {exc.accepted}") from None
    except yaml.YAMLError as exc:       # pragma: no cover (strict_yaml names YAML errors)
        raise ReceiptError(f"receipt {named}: not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ReceiptError(f"receipt {named}: not a mapping (a k3infra.receipt/v1 document)")
    try:
        return parse_receipt(data)
    except ValidationError as exc:
        raise ReceiptError(f"receipt {named}: {problems(exc)}") from None
