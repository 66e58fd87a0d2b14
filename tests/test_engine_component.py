"""EngineBuild under the Pulumi SDK mocks: each mode registers what it should and its
`image` output is the digest the build reported (never a tag, never a guess)."""
from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pulumi
import pytest

from k3infra.config import ConfigError, parse_stack_config
from k3infra.engine import component as ec
from k3infra.engine.plan import resolve_engine
from k3infra.engine.result import EngineBuildError
from k3infra.receipt import load_receipt

from conftest import GOOD_REVISION, ROOT

def _recipe_with_locks() -> str:
    """images/ as shipped, plus stand-in lock files (the real ones are compiled per engine
    commit by a maintainer; their absence is tested below)."""
    import atexit
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="k3-recipe-"))
    atexit.register(shutil.rmtree, d, True)     # made at import, for the whole run
    for name in ec.RECIPE_FILES:
        if name in ec.LOCK_FILES:
            (d / name).write_text(f"# stand-in {name}\nexample==1.0 --hash=sha256:{'0' * 64}\n")
        else:
            shutil.copy(ROOT / "images" / name, d / name)
    return str(d)


RECIPE_DIR = _recipe_with_locks()
DIGEST = "sha256:" + "ab" * 32
WHEEL = "cd" * 32
FULL = None     # set from the receipt below (the commit's prefix + padding)
REPO = "registry.example.com/k3/vllm"
PREBUILT = f"registry.example.com/k3/vllm@sha256:{'12' * 32}"


def full_commit() -> str:
    short = load_receipt().engine.commit
    return short + "0" * (40 - len(short))


def config(**keys):
    raw = {"weightsRevision": GOOD_REVISION, "apiKey": "k", **keys}
    return parse_stack_config(raw, receipt=load_receipt())


BUILDKIT = f"moby/buildkit:v0.23.2-rootless@sha256:{'34' * 32}"
REPORTER = f"python:3.12.11-slim-bookworm@sha256:{'56' * 32}"


API_SERVER = "10.0.0.10/32"
BASE_IMAGES = {"cudaDevel": "nvidia/cuda:13.0.2-devel-ubuntu22.04@sha256:" + "71" * 32,
               "uv": "ghcr.io/astral-sh/uv:0.8.22@sha256:" + "72" * 32,
               "rust": "rust:1.90.0-slim-bookworm@sha256:" + "73" * 32}
RESULT_UID = "uid-of-the-created-result"


def in_cluster(**engine):
    return config(engine={"build": "in-cluster", "registry": REPO, "registrySecret": "push",
                          "buildkitImage": BUILDKIT, "reporterImage": REPORTER,
                          "commit": full_commit(), "apiServerCidrs": [API_SERVER],
                          "baseImages": BASE_IMAGES, **engine})


class Recorder(pulumi.runtime.Mocks):
    """Records registrations; plays the build: the result ConfigMap read returns what
    the Job's report container would have written, docker-build returns a digest."""

    def __init__(self, result_data=None, image_digest=DIGEST, immutable=True,
                 read_uid=RESULT_UID):
        self.resources = []
        self.result_data = result_data
        self.image_digest = image_digest
        self.immutable = immutable
        self.read_uid = read_uid

    def new_resource(self, args):
        if args.typ != "pulumi:pulumi:Stack":
            self.resources.append(args)
        outputs = dict(args.inputs)
        if args.typ == "kubernetes:core/v1:ConfigMap" and args.resource_id:
            outputs = {"data": self.result_data, "immutable": self.immutable,
                       "metadata": {"uid": self.read_uid}}
        elif args.typ == "kubernetes:core/v1:ConfigMap" and args.name.endswith("-result"):
            outputs["metadata"] = {**outputs.get("metadata", {}), "uid": RESULT_UID}
        if args.typ == "docker-build:index:Image":
            outputs["digest"] = self.image_digest if args.inputs.get("push") else ""
            outputs["contextHash"] = "h" * 8
        return f"{args.name}-id", outputs

    def call(self, args):
        return {}

    def of_type(self, typ):
        return [r for r in self.resources if r.typ == typ]


def run(build, mocks, preview=False):
    """Run `build()` (which creates the component) the way the Pulumi runtime runs a
    program under mocks, then resolve the component's outputs."""
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    loop = asyncio.new_event_loop()
    # A refused result fails every Output derived from it; the ones nobody awaited
    # would be reported again when collected.
    loop.set_exception_handler(
        lambda lp, ctx: None if "never retrieved" in ctx.get("message", "")
        else lp.default_exception_handler(ctx))
    asyncio.set_event_loop(loop)
    made = {}
    try:
        pulumi.runtime.set_mocks(mocks, project="k3", stack="test", preview=preview)
        _sync_await(run_pulumi_func(lambda: made.setdefault("c", build())))
        comp = made["c"]
        outs = pulumi.Output.all(comp.image, comp.image_digest, comp.engine_commit,
                                 comp.wheel_sha256, comp.profile_label)
        return comp, _sync_await(outs.future())
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()
        asyncio.set_event_loop(None)


def result_data(**over):
    r = load_receipt()
    data = {"digest": DIGEST, "image": f"{REPO}@{DIGEST}", "wheelSha256": WHEEL,
            "engineCommit": full_commit(), "vllmVersion": r.engine.version}
    data.update(over)
    return data


def test_prebuilt_passes_the_digest_through_and_creates_nothing():
    mocks = Recorder()
    cfg = config(engineImage=PREBUILT)
    comp, (image, digest, commit, wheel, label) = run(
        lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": cfg}), mocks)
    assert image == PREBUILT
    assert digest == "sha256:" + "12" * 32
    assert commit == load_receipt().engine.commit
    assert wheel is None
    assert label.startswith("measured:")
    assert [r.typ for r in mocks.resources] == ["k3infra:index:EngineBuild"]


def test_prebuilt_carries_a_declared_wheel_hash():
    cfg = config(engineImage=PREBUILT, engine={"build": "prebuilt", "wheelSha256": WHEEL})
    _, (_, _, _, wheel, _) = run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": cfg}), Recorder())
    assert wheel == WHEEL


def test_upstream_is_labelled_not_measured_and_has_no_engine_commit():
    cfg = config(profile="upstream", engineImage=PREBUILT,
                 engine={"build": "prebuilt", "upstreamVersion": "0.33.1"})
    comp, (image, _, commit, _, label) = run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": cfg}),
                                             Recorder())
    assert image == PREBUILT
    assert commit is None
    assert "not the measured engine" in label and "0.33.1" in label
    assert comp.plan.measured is False


def test_in_cluster_image_is_the_digest_the_job_reported():
    mocks = Recorder(result_data=result_data())
    comp, (image, digest, commit, wheel, _) = run(
        lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": in_cluster(), "recipeDir": RECIPE_DIR}),
        mocks)
    assert image == f"{REPO}@{DIGEST}"
    assert digest == DIGEST
    assert commit == full_commit()
    assert wheel == WHEEL
    jobs = mocks.of_type("kubernetes:batch/v1:Job")
    assert len(jobs) == 1
    job = jobs[0].inputs
    build = job["spec"]["template"]["spec"]["initContainers"][1]
    env = {e["name"]: e.get("value") for e in build["env"]}
    assert env["K3_IMAGE"] == f"{REPO}:vllm-{load_receipt().engine.commit}-cu130"
    # The read of the result ConfigMap is ordered after the Job.
    reads = [r for r in mocks.of_type("kubernetes:core/v1:ConfigMap") if r.resource_id]
    assert len(reads) == 1
    assert reads[0].resource_id.endswith(job["metadata"]["name"].replace("engine-build",
                                                                         "engine-result"))


def test_in_cluster_registers_rbac_configmaps_job_and_one_read():
    mocks = Recorder(result_data=result_data())
    run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": in_cluster(), "recipeDir": RECIPE_DIR}),
        mocks)
    kinds = Counter(r.typ.split(":")[-1] for r in mocks.resources if r.typ.startswith("kubernetes:"))
    # job files, context, result (created) + the result read
    assert kinds == {"Namespace": 1, "NetworkPolicy": 2, "ServiceAccount": 1, "Role": 1,
                     "RoleBinding": 1, "ConfigMap": 4, "Job": 1}
    reads = [r for r in mocks.resources if r.resource_id]
    assert [r.resource_id.split("/")[0] for r in reads] == ["kimi-k3-build"]   # namespace unset: the base name
    context = next(r for r in mocks.resources if r.name == "engine-context")
    assert set(context.inputs["data"]) == set(ec.RECIPE_FILES)
    assert context.inputs["data"]["Dockerfile"] == (ROOT / "images" / "Dockerfile").read_text()


def test_a_build_without_hash_locked_requirements_is_refused_on_update(monkeypatch):
    """Issue 21: Python packages only from hash-locked files; images/ ships none until a
    maintainer compiles them for the engine commit, so `pulumi up` refuses."""
    from k3infra.gates import GateError

    monkeypatch.setenv("K3INFRA_OFFLINE_RENDER", "1")     # ignored: not an offline render
    shipped = ROOT / "images"
    missing = [n for n in ec.LOCK_FILES if not (shipped / n).is_file()]
    if not missing:
        pytest.skip("images/ carries compiled locks")
    mocks = Recorder(result_data=result_data())
    with pytest.raises(GateError) as err:
        run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": in_cluster(), "recipeDir": str(shipped)}),
            mocks)
    assert all(f"images/{n}" in str(err.value) for n in missing)
    assert mocks.resources == []


def test_in_cluster_git_context_uploads_no_recipe():
    cfg = in_cluster(context="git", gitUrl="https://git.example.com/k3infra.git",
                     gitRevision="1" * 40)
    mocks = Recorder(result_data=result_data())
    run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": cfg}), mocks)
    assert not [r for r in mocks.resources if r.name == "engine-context"]
    job = mocks.of_type("kubernetes:batch/v1:Job")[0].inputs
    env = {e["name"]: e.get("value")
           for e in job["spec"]["template"]["spec"]["initContainers"][1]["env"]}
    assert env["K3_CONTEXT"] == f"https://git.example.com/k3infra.git#{'1' * 40}:images"


@pytest.mark.parametrize("bad, message", [
    ({"digest": ""}, "no image digest"),
    ({"image": f"other.example.com/x@{DIGEST}"}, "is not registry.example.com/k3/vllm@"),
    ({"engineCommit": "f" * 40}, "is not the pinned"),
    # Issue 21: another commit with the receipt's prefix is still not the pinned one.
    ({"engineCommit": load_receipt().engine.commit + "1" * (40 - len(load_receipt().engine.commit))},
     "is not the pinned"),
    ({"vllmVersion": "0.33.0"}, "is not the receipt's"),
    ({"wheelSha256": "xyz"}, "no wheel sha256"),
])
def test_in_cluster_refuses_a_result_that_does_not_match_the_plan(bad, message):
    mocks = Recorder(result_data=result_data(**bad))
    with pytest.raises(Exception) as err:
        run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": in_cluster(),
                                              "recipeDir": RECIPE_DIR}), mocks)
    assert message in str(err.value)


@pytest.mark.parametrize("over, message", [
    ({"immutable": None}, "is not immutable"),
    ({"immutable": False}, "is not immutable"),
    ({"read_uid": "uid-of-a-recreated-configmap"}, "deleted and re-created"),
])
def test_in_cluster_refuses_a_result_configmap_that_could_have_been_edited(over, message):
    """Issue 21: the result ConfigMap decides the served digest; it is read only when
    the Job's one write made it immutable and it is still the object Pulumi created."""
    mocks = Recorder(result_data=result_data(), **over)
    with pytest.raises(Exception) as err:
        run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": in_cluster(),
                                              "recipeDir": RECIPE_DIR}), mocks)
    assert message in str(err.value)


def test_in_cluster_offline_render_shows_a_labelled_placeholder():
    mocks = Recorder(result_data=None)
    _, (image, digest, _, wheel, _) = run(
        lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": in_cluster(), "recipeDir": RECIPE_DIR,
                                          "offlineRender": True}),
        mocks)
    assert image == f"{REPO}@{ec.PLACEHOLDER_DIGEST}"
    assert wheel is None


def test_in_cluster_without_a_result_outside_a_render_is_an_error(monkeypatch):
    # The former render switch is ignored: only the explicit offlineRender arg counts.
    monkeypatch.setenv("K3INFRA_OFFLINE_RENDER", "1")
    with pytest.raises(Exception) as err:
        run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": in_cluster(),
                                              "recipeDir": RECIPE_DIR}),
            Recorder(result_data=None))
    assert "no image digest" in str(err.value)


CACHE_REPO = "registry.example.com/k3/vllm-buildcache"


def local_cfg(**engine):
    return config(engine={"build": "local", "registry": REPO, "commit": full_commit(),
                          "cacheRegistry": CACHE_REPO, "baseImages": BASE_IMAGES, **engine})


def write_record(export_root: Path, plan, sha=WHEEL, commit=None):
    from k3infra.engine.manifests import recipe_hash

    d = export_root / f"wheel-{recipe_hash(plan, ec.recipe_files(Path(RECIPE_DIR)))}"
    d.mkdir(parents=True)
    r = load_receipt()
    (d / "engine-wheel.json").write_text(json.dumps({
        "wheel": "vllm.whl", "sha256": sha, "version": r.engine.version,
        "engine_commit": commit or full_commit()}))
    return d


def test_local_two_passes_and_the_record_reaches_the_labels(tmp_path):
    cfg = local_cfg()
    plan = resolve_engine(load_receipt(), cfg)
    export = write_record(tmp_path, plan)
    mocks = Recorder()
    comp, (image, digest, commit, wheel, _) = run(
        lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": cfg, "recipeDir": RECIPE_DIR,
                                          "exportDir": str(tmp_path)}), mocks)
    images = mocks.of_type("docker-build:index:Image")
    assert [i.inputs["target"] for i in images] == ["wheel-export", "runtime"]
    wheel_pass, runtime_pass = (i.inputs for i in images)
    assert wheel_pass["push"] is False
    assert wheel_pass["exports"] == [{"local": {"dest": str(export)}}]
    assert wheel_pass["buildArgs"] == plan.build_args
    assert runtime_pass["push"] is True
    assert runtime_pass["tags"] == [plan.tagged_ref]
    assert runtime_pass["buildArgs"] == {**plan.build_args, "WHEEL_SHA256": WHEEL,
                                         "ENGINE_COMMIT_FULL": full_commit()}
    assert runtime_pass["cacheTo"][0]["registry"]["ref"] == f"{CACHE_REPO}:buildcache"
    assert runtime_pass["cacheTo"][0]["registry"]["mode"] == "max"
    assert image == f"{REPO}@{DIGEST}" and digest == DIGEST
    assert wheel == WHEEL and commit == full_commit()


def test_local_without_pass_one_record_is_an_error(tmp_path):
    with pytest.raises(Exception) as err:
        run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": local_cfg(),
                                              "recipeDir": RECIPE_DIR,
                                              "exportDir": str(tmp_path)}), Recorder())
    assert "engine-wheel.json is missing" in str(err.value)


class FirstPreview(Recorder):
    """A real first `pulumi preview`: docker-build reports contextHash, but the builds
    do not run, so a new Image has no id (and pass 1 exported nothing yet)."""

    def new_resource(self, args):
        _, outputs = super().new_resource(args)
        if args.typ == "docker-build:index:Image":
            return "", outputs
        return f"{args.name}-id", outputs


def test_local_first_preview_reads_no_export(tmp_path):
    comp, values = run(
        lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": local_cfg(), "recipeDir": str(ROOT / "images"),
                                          "exportDir": str(tmp_path)}), FirstPreview(), preview=True)
    assert values is None       # unknown until `pulumi up` built it: no error, no guess
    assert not any(tmp_path.iterdir())


def test_local_refuses_a_record_of_another_commit(tmp_path):
    cfg = local_cfg()
    write_record(tmp_path, resolve_engine(load_receipt(), cfg), commit="e" * 40)
    with pytest.raises(Exception) as err:
        run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": cfg, "recipeDir": RECIPE_DIR,
                                              "exportDir": str(tmp_path)}), Recorder())
    assert "is not the pinned" in str(err.value)


def test_local_without_a_cache_repository_uses_no_registry_cache(tmp_path):
    """Issue 21: the build cache never shares the serving image's repository."""
    cfg = local_cfg(cacheRegistry=None)
    write_record(tmp_path, resolve_engine(load_receipt(), cfg))
    mocks = Recorder()
    run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": cfg, "recipeDir": RECIPE_DIR,
                                          "exportDir": str(tmp_path)}), mocks)
    for image in mocks.of_type("docker-build:index:Image"):
        assert not image.inputs.get("cacheFrom") and not image.inputs.get("cacheTo")


@pytest.mark.parametrize("engine, key", [
    ({"build": "local", "registry": REPO, "commit": None}, "k3:engine.commit"),
    ({"build": "local", "registry": REPO, "baseImages": {}}, "k3:engine.baseImages.cudaDevel"),
    ({"build": "in-cluster", "registry": REPO, "registrySecret": "push",
      "buildkitImage": BUILDKIT, "reporterImage": REPORTER, "commit": None}, "k3:engine.commit"),
    ({"build": "in-cluster", "registry": REPO, "registrySecret": "push",
      "buildkitImage": BUILDKIT, "reporterImage": REPORTER, "apiServerCidrs": []},
     "k3:engine.apiServerCidrs"),
])
def test_a_build_without_its_pins_is_refused_on_update(monkeypatch, engine, key):
    """Issue 21: no build from the receipt's 8-hex prefix; no build Job that could reach
    the API server at any cluster address."""
    from k3infra.gates import GateError

    monkeypatch.setenv("K3INFRA_OFFLINE_RENDER", "1")     # ignored: not an offline render
    base = {"commit": full_commit(), "apiServerCidrs": [API_SERVER], "baseImages": BASE_IMAGES}
    cfg = config(engine={**base, **{k: v for k, v in engine.items()}})
    mocks = Recorder(result_data=result_data())
    with pytest.raises(GateError) as err:
        run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": cfg, "recipeDir": RECIPE_DIR}),
            mocks)
    assert key in str(err.value)
    assert mocks.resources == []


def test_bad_engine_config_fails_before_any_registration():
    mocks = Recorder()
    cfg = config(engine={"build": "in-cluster", "registry": REPO})
    with pytest.raises(ConfigError) as err:
        run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": cfg}), mocks)
    assert err.value.key == "k3:engine.registrySecret"
    assert mocks.resources == []


def test_missing_recipe_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ec.RecipeError) as err:
        ec.find_recipe_dir(str(tmp_path))
    assert str(err.value) == (f"k3:engine.recipeDir = '{tmp_path}': no engine recipe "
                              f"(Dockerfile) in {tmp_path}: a recipe is a directory with a "
                              "Dockerfile and its build.lock and runtime.lock")
    with pytest.raises(ec.RecipeError, match="is not a directory"):
        ec.find_recipe_dir(str(tmp_path / "absent"))


def test_the_recipe_is_never_looked_up_from_the_working_directory(tmp_path, monkeypatch):
    """An images/Dockerfile in the directory a program runs from is not the engine's:
    the default is the package's recipe, or the checkout's beside an editable install."""
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "Dockerfile").write_text("FROM scratch\n")
    monkeypatch.chdir(tmp_path)
    assert ec.find_recipe_dir() in (ec.PACKAGED_RECIPE, ec.CHECKOUT_RECIPE)
    assert ec.find_recipe_dir() == ROOT / "images"      # this checkout (no packaged copy)


def test_in_cluster_with_placeholder_image_digests_is_refused_on_update(monkeypatch):
    from k3infra.gates import GateError

    monkeypatch.setenv("K3INFRA_OFFLINE_RENDER", "1")     # ignored: not an offline render
    cfg = config(engine={"build": "in-cluster", "registry": REPO, "registrySecret": "push"})
    mocks = Recorder(result_data=result_data())
    with pytest.raises(GateError) as err:
        run(lambda: ec.EngineBuild("engine", {"receipt": load_receipt(), "config": cfg, "recipeDir": RECIPE_DIR}),
            mocks)
    assert "k3:engine.buildkitImage" in str(err.value) and "k3:engine.reporterImage" in str(err.value)
    assert mocks.resources == []


def test_a_recipe_of_your_own_is_its_dockerfile_and_locks(tmp_path):
    """k3:engine.recipeDir: the helper is optional; only regular files are read (a FIFO
    would hang the program, a link could point anywhere), each refused in one line."""
    import os

    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    for lock in ec.LOCK_FILES:
        (tmp_path / lock).write_text("# no packages\n")
    assert sorted(ec.recipe_files(tmp_path)) == ["Dockerfile", "build.lock", "runtime.lock"]
    assert ec.find_recipe_dir(str(tmp_path)) == tmp_path
    (tmp_path / "runtime.lock").unlink()
    os.mkfifo(tmp_path / "runtime.lock")
    with pytest.raises(ec.RecipeError) as err:       # a ConfigError: one line, the key named
        ec.recipe_files(tmp_path)
    assert str(err.value) == (f"k3:engine.recipeDir = '{tmp_path}': {tmp_path}/runtime.lock: "
                              "a FIFO, not a regular file (a recipe is plain files)")
    (tmp_path / "runtime.lock").unlink()
    (tmp_path / "runtime.lock").symlink_to("/etc/passwd")
    with pytest.raises(ec.RecipeError, match="a symbolic link, not a regular file"):
        ec.recipe_files(tmp_path)
    (tmp_path / "runtime.lock").unlink()
    (tmp_path / "runtime.lock").write_text("x" * (ec.MAX_RECIPE_BYTES + 1))
    with pytest.raises(ec.RecipeError, match="fit the context ConfigMap"):
        ec.recipe_files(tmp_path)
