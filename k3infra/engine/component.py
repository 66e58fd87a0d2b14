"""`EngineBuild`: the engine image a stack serves, pinned by digest, in three modes.

    prebuilt    k3:engineImage (repo@sha256:...) as given; nothing is created
    in-cluster  a Job on a CPU node runs rootless BuildKit over images/ and pushes to
                k3:engine.registry; it writes the pushed digest and the wheel record into
                a ConfigMap that this component reads back (manifests.py, pod/)
    local       pulumi-docker-build on the operator's machine: pass 1 exports the wheel
                record, pass 2 builds and pushes the runtime image with it as labels

`image` (repo@sha256:...) is what K3ServingStack gives the StatefulSet; `engine_commit`,
`wheel_sha256` and `image_digest` become stack outputs.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Optional, TypedDict, Union

import pulumi
import pulumi_kubernetes as k8s

from k3infra.config import ConfigError, StackConfig
from k3infra.engine import manifests as em
from k3infra.engine.plan import EnginePlan, build_namespace, engine_gates, resolve_engine
from k3infra.engine.result import (BuildResult, EngineBuildError, check_result_object,
                                   image_from_digest, parse_build_result, parse_wheel_record)
from k3infra import naming, podfiles
from k3infra.gates import PLACEHOLDER_HEX, enforce, Gate
from k3infra.inputs import StackInputs
from k3infra.kube import apply_manifest, child_options
from k3infra.plan import ServingPlan, given_or_resolved
from k3infra.podcommon import read_regular
from k3infra.receipt import Receipt

# Files of images/ the Dockerfile uses: the helper and the hash-locked requirements.
# The locks are compiled once per engine commit by a maintainer with access to both
# package indexes (docs/engine.md, "Supply chain"); a build without them is refused.
RECIPE_FILES = ("Dockerfile", "k3_engine_build.py", "build.lock", "runtime.lock")
LOCK_FILES = ("build.lock", "runtime.lock")
PLACEHOLDER_DIGEST = f"sha256:{PLACEHOLDER_HEX}"


class EngineBuildArgs(TypedDict, total=False):
    config: Union[StackConfig, StackInputs]  # the validated stack config (required)
    receipt: Receipt         # the receipt the stack deploys (required)
    base: str                # object name prefix (default: kimi-k3); the namespace when
                             # the config names none
    labels: dict             # labels on build objects
    recipeDir: str           # the images/ directory (default: the package's, find_recipe_dir)
    exportDir: str           # local mode: where pass 1 exports (default: ./build/engine)
    gatesEnforced: bool      # the caller already ran engine_gates (K3ServingStack does)
    offlineRender: bool      # `k3infra render`: builds never run, digests are placeholders
    plan: ServingPlan        # the stack's (k3infra.plan): its engine, else resolved here


# An installed package carries images/ here (setup.py's build_py copies it in);
# an editable install of a checkout reads the checkout's images/ beside the package.
PACKAGED_RECIPE = Path(__file__).resolve().parent / "recipe"
CHECKOUT_RECIPE = Path(__file__).resolve().parents[2] / "images"


class RecipeError(ConfigError):
    """k3:engine.recipeDir (or recipeDir) names no usable recipe: one line naming the key,
    the value and why, raised before anything is created (a ConfigError, so `k3infra
    render` and the program print it as every other refused key)."""

    def __init__(self, value: Any, problem: str, key: str = "k3:engine.recipeDir"):
        super().__init__(key, value, problem)


def find_recipe_dir(explicit: Optional[str] = None, key: str = "k3:engine.recipeDir") -> Path:
    """The engine recipe: `explicit` (recipeDir), else the one shipped in the package,
    else a checkout's images/ beside the package. Never looked up from the working
    directory: an unrelated images/ there must not become the engine."""
    if explicit:
        found = Path(explicit)      # relative: to the Pulumi project, where programs run
    else:
        found = next((c for c in (PACKAGED_RECIPE, CHECKOUT_RECIPE)
                      if (c / "Dockerfile").is_file()), PACKAGED_RECIPE)
    if not found.is_dir():
        raise RecipeError(explicit or str(found), "is not a directory (a recipe is a directory "
                          "with a Dockerfile and its build.lock and runtime.lock)", key)
    if not os.path.lexists(found / "Dockerfile"):
        raise RecipeError(explicit or str(found), f"no engine recipe (Dockerfile) in {found}: "
                          "a recipe is a directory with a Dockerfile and its build.lock and "
                          "runtime.lock", key)
    return found


# The context travels in one ConfigMap (1 MiB with its metadata).
MAX_RECIPE_BYTES = 900 * 1024


def recipe_files(recipe: Path, key: str = "k3:engine.recipeDir") -> dict[str, str]:
    """The recipe's files (RECIPE_FILES that exist: a missing lock is refused by
    lock_gates, the helper is optional in a recipe of your own), read by the one bounded
    reader: only regular files, no link followed (a FIFO would hang the program, a link
    could point anywhere), at most MAX_RECIPE_BYTES in all, UTF-8; RecipeError else."""
    files: dict[str, str] = {}
    left = MAX_RECIPE_BYTES
    for name in RECIPE_FILES:
        path = recipe / name
        if not os.path.lexists(path):
            continue
        try:
            raw = read_regular(str(path), left)
        except OSError as exc:
            if exc.errno == errno.EFBIG:
                raise RecipeError(str(recipe), f"the recipe's files are more than "
                                  f"{MAX_RECIPE_BYTES} bytes; at most {MAX_RECIPE_BYTES} fit "
                                  "the context ConfigMap", key) from None
            raise RecipeError(str(recipe), f"{path}: {exc.strerror or exc} (a recipe is "
                              "plain files)", key) from None
        try:
            files[name] = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise RecipeError(str(recipe), f"{path}: not UTF-8 text", key) from None
        left -= len(raw)
    return files


def engine_recipe(plan: EnginePlan, cfg: StackConfig, explicit: Optional[str] = None
                  ) -> Optional[tuple[Path, dict[str, str]]]:
    """(directory, files) of the recipe this engine plan builds from, read and checked
    (find_recipe_dir, recipe_files), or None when it builds from none (prebuilt, git).
    Called before anything is created: by K3ServingStack and by EngineBuild."""
    uses_recipe = plan.mode == "local" or (plan.mode == "in-cluster"
                                           and cfg.engine.context == "configmap")
    if not uses_recipe:
        return None
    key = "recipeDir" if explicit else "k3:engine.recipeDir"
    recipe = find_recipe_dir(explicit or cfg.engine.recipe_dir, key)
    return recipe, recipe_files(recipe, key)


def lock_gates(recipe: Optional[Path]) -> list:
    """Hash-locked requirements the recipe needs: missing ones refuse `pulumi up`."""
    if recipe is None:
        return []
    return [Gate(f"images/{name}", f"missing: the engine installs Python packages only from "
                 f"hash-locked files; compile {name} for this engine commit (docs/engine.md, "
                 "\"Supply chain\")") for name in LOCK_FILES if not (recipe / name).is_file()]


def job_files() -> dict[str, str]:
    return podfiles.package_files("k3infra.engine.pod", em.JOB_SCRIPTS)


def _uid(meta: Any) -> Optional[str]:
    """metadata.uid of a read or created object (None where the engine has none yet)."""
    if meta is None:
        return None
    return meta.get("uid") if isinstance(meta, dict) else getattr(meta, "uid", None)


def placeholder_result(plan: EnginePlan, why: str) -> BuildResult:
    pulumi.log.warn(f"k3:engine.build = {plan.mode}: the image digest is {why}; the render "
                    f"shows {plan.repository}@{PLACEHOLDER_DIGEST}")
    return BuildResult(image=f"{plan.repository}@{PLACEHOLDER_DIGEST}", digest=PLACEHOLDER_DIGEST,
                       wheel_sha256=None, engine_commit=plan.engine_commit or "",
                       vllm_version=plan.engine_version or "")


class EngineBuild(pulumi.ComponentResource):
    """The serving image, by digest: prebuilt, built in-cluster, or built locally."""

    image: pulumi.Output[str]
    image_digest: pulumi.Output[str]
    engine_commit: pulumi.Output[Optional[str]]
    engine_version: pulumi.Output[Optional[str]]
    wheel_sha256: pulumi.Output[Optional[str]]
    profile_label: pulumi.Output[str]
    plan: EnginePlan

    def __init__(self, name: str, args: EngineBuildArgs,
                 opts: Optional[pulumi.ResourceOptions] = None):
        inputs = StackInputs.of(args["config"])
        if inputs.plain.namespace is None:     # standalone: named like its objects
            inputs = inputs.with_plain(lambda c: c.model_copy(
                update={"namespace": args.get("base", naming.APP)}))
        cfg = inputs.plain
        receipt = args.get("receipt")
        if not isinstance(receipt, Receipt):
            raise TypeError(f"EngineBuild {name}: args['receipt'] must be the Receipt the "
                            "stack deploys (k3infra.receipt.load_receipt() for the shipped one)")
        # Everything that can refuse does so before the first registration.
        given = args.get("plan")
        plan = (given_or_resolved(args, receipt, cfg, f"EngineBuild {name}").engine
                if given is not None else resolve_engine(receipt, cfg))
        self.offline_render = bool(args.get("offlineRender"))
        if not args.get("gatesEnforced"):
            enforce(engine_gates(receipt, cfg), self.offline_render)
        found = engine_recipe(plan, cfg, args.get("recipeDir"))
        recipe, self._recipe_files = found if found is not None else (None, {})
        enforce(lock_gates(recipe), self.offline_render)
        super().__init__("k3infra:index:EngineBuild", name, None, opts)
        self._opts = opts
        self.plan = plan
        self.build_objects: dict[str, pulumi.CustomResource] = {}

        if plan.mode == "prebuilt":
            # k3:engineImage may be wired (a build's digest): resolved and checked in apply.
            image = pulumi.Output.from_input(inputs.build(lambda c: resolve_engine(receipt, c).image))
            self.image = image
            self.image_digest = image.apply(lambda ref: ref.rsplit("@", 1)[1])
            self.engine_commit = pulumi.Output.from_input(plan.engine_commit)
            self.wheel_sha256 = pulumi.Output.from_input(plan.wheel_sha256)
        else:
            if plan.mode == "in-cluster":
                result = self._in_cluster(name, plan, cfg, args, recipe)
            else:
                result = self._local(name, plan, args, recipe)
            self.image = result.apply(lambda r: r.image)
            self.image_digest = result.apply(lambda r: r.digest)
            self.engine_commit = result.apply(lambda r: r.engine_commit)
            self.wheel_sha256 = result.apply(lambda r: r.wheel_sha256)
        self.engine_version = pulumi.Output.from_input(plan.engine_version)
        self.profile_label = pulumi.Output.from_input(plan.label)
        self.register_outputs({"image": self.image, "imageDigest": self.image_digest,
                               "engineCommit": self.engine_commit,
                               "engineVersion": self.engine_version,
                               "wheelSha256": self.wheel_sha256,
                               "engineProfile": self.profile_label})

    # --- in-cluster ----------------------------------------------------------------

    def _in_cluster(self, name: str, plan: EnginePlan, cfg: StackConfig, args: EngineBuildArgs,
                    recipe: Optional[Path]) -> pulumi.Output[BuildResult]:
        context = self._recipe_files
        scripts = job_files()
        names = em.BuildNames(args.get("base", naming.APP), build_namespace(cfg),
                              em.build_hash(plan, cfg, context, scripts))
        labels = dict(args.get("labels") or {"app.kubernetes.io/component": "engine-build",
                                             "app.kubernetes.io/part-of": "k3infra"})
        objs = em.build_manifests(plan, cfg, names, labels, context, scripts)
        ns = apply_manifest(f"{name}-namespace", objs["namespace"], child_options(self, self._opts))
        in_ns = child_options(self, self._opts, ns)
        created = {"namespace": ns}
        for role, manifest in objs.items():
            if role in ("namespace", "job"):
                continue
            # The Job writes the result's data and makes it immutable: Pulumi never
            # rewrites it (the digest is read back once per build hash, checked below).
            extra = (pulumi.ResourceOptions(ignore_changes=["data", "immutable"])
                     if role == "result" else None)
            created[role] = apply_manifest(f"{name}-{role}", manifest,
                                           pulumi.ResourceOptions.merge(in_ns, extra))
        wait = f"{em.job_timeout_minutes(cfg)}m"
        job = apply_manifest(f"{name}-job", objs["job"], child_options(
            self, self._opts, *created.values(),
            # Fixed, hash-derived name: a failed build is re-run with
            # `pulumi up --replace <job urn>`, which must delete the old Job first.
            delete_before_replace=True,
            custom_timeouts=pulumi.CustomTimeouts(create=wait, update=wait)))
        created["job"] = job
        self.build_objects = created
        # The read waits for the Job (which Pulumi awaits until it completes); its id is
        # unknown in a preview of a new build, so nothing is read before the Job ran.
        read_id = job.metadata.apply(lambda _: f"{names.namespace}/{names.result_configmap}")
        result_cm = k8s.core.v1.ConfigMap.get(
            f"{name}-result-read", read_id,
            opts=child_options(self, self._opts, job))
        where = f"ConfigMap {names.namespace}/{names.result_configmap}"

        def parse(values: list) -> BuildResult:
            data, immutable, uid, created_uid = values
            if self.offline_render and not (data or {}).get("digest"):
                return placeholder_result(plan, f"written by Job {names.job} at `pulumi up`")
            check_result_object(immutable, uid, created_uid, where)
            return parse_build_result(data, plan, where)

        return pulumi.Output.all(result_cm.data, result_cm.immutable,
                                 result_cm.metadata.apply(_uid),
                                 created["result"].metadata.apply(_uid)).apply(parse)

    # --- local ---------------------------------------------------------------------

    def _local(self, name: str, plan: EnginePlan, args: EngineBuildArgs,
               recipe: Path) -> pulumi.Output[BuildResult]:
        # Here, not at the top: pulumi-docker-build is optional (the `docker-build`
        # extra), needed by k3:engine.build = local only.
        import pulumi_docker_build as docker_build

        # The project directory (Pulumi runs programs there), never inside the package.
        export_root = Path(args.get("exportDir") or Path.cwd() / "build" / "engine")
        export = export_root / f"wheel-{em.recipe_hash(plan, self._recipe_files)}"
        context = docker_build.BuildContextArgs(location=str(recipe))
        dockerfile = docker_build.DockerfileArgs(location=str(recipe / "Dockerfile"))
        # A registry cache only in its own repository (k3:engine.cacheRegistry).
        cache_from = [docker_build.CacheFromArgs(
            registry=docker_build.CacheFromRegistryArgs(ref=plan.cache_ref))] if plan.cache_ref else []
        child = child_options(self, self._opts)
        wheel = docker_build.Image(
            f"{name}-wheel", push=False, context=context, dockerfile=dockerfile,
            target="wheel-export", build_args=plan.build_args, build_on_preview=False,
            platforms=[docker_build.Platform.LINUX_AMD64], cache_from=cache_from,
            exports=[docker_build.ExportArgs(local=docker_build.ExportLocalArgs(dest=str(export)))],
            opts=child)

        def record(_: Any) -> dict:
            if self.offline_render:
                return {}
            path = export / "engine-wheel.json"
            if not path.is_file():
                raise EngineBuildError(
                    f"{path} is missing: pass 1 exported it on another machine or it was "
                    f"deleted; rebuild with `pulumi up --replace` on {name}-wheel")
            try:    # the one bounded reader: what pass 1 exported, a small regular file
                text = read_regular(str(path), 1 << 20).decode("utf-8", "replace")
            except OSError as exc:
                raise EngineBuildError(f"{path}: cannot be read ({exc.strerror or exc})") from None
            return parse_wheel_record(text, plan, str(path))

        # The export exists only once pass 1 ran: wait for the wheel build's id, which a
        # preview leaves unknown for a new build (its contextHash is known in preview, so
        # reading the file on contextHash failed every first `pulumi preview`).
        rec = pulumi.Output.all(wheel.id, wheel.context_hash).apply(record)
        runtime_args = rec.apply(lambda r: {**plan.build_args,
                                            "WHEEL_SHA256": r.get("sha256", ""),
                                            "ENGINE_COMMIT_FULL": r.get("engine_commit", "")})
        image = docker_build.Image(
            f"{name}-image", push=True, context=context, dockerfile=dockerfile,
            target="runtime", build_args=runtime_args, build_on_preview=False,
            platforms=[docker_build.Platform.LINUX_AMD64], tags=[plan.tagged_ref],
            cache_from=cache_from,
            cache_to=[docker_build.CacheToArgs(registry=docker_build.CacheToRegistryArgs(
                ref=plan.cache_ref, mode=docker_build.CacheMode.MAX, ignore_error=True))]
            if plan.cache_ref else [],
            opts=child_options(self, self._opts, wheel))
        self.build_objects = {"wheel": wheel, "image": image}

        def result(values: list) -> BuildResult:
            digest, r = values
            if self.offline_render and not digest:
                return placeholder_result(plan, "known once the local build pushed at `pulumi up`")
            return BuildResult(image=image_from_digest(plan.repository, digest, plan),
                               digest=digest, wheel_sha256=r["sha256"],
                               engine_commit=r["engine_commit"], vllm_version=r["version"])

        return pulumi.Output.all(image.digest, rec).apply(result)

