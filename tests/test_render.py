"""`k3infra render`: the real stack program under the SDK's mocks, written to disk."""
import json

import pulumi
import pytest
import yaml

from k3infra.cli import main
from k3infra.receipt import load_receipt
from k3infra.render import write_render

from conftest import GOOD_REVISION, ROOT, render

PIN = f"weightsRevision={GOOD_REVISION}"
API_KEY = "sk-k3-test-DO-NOT-LEAK-7f3a9c"
HF_TOKEN = "hf_DoNotLeakThisToken1234567890"


def test_plan_and_manifests_on_disk(tmp_path):
    r = render("existing", PIN)
    written = write_render(r, tmp_path)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["stack"] == "existing"
    types = [res["type"] for res in plan["resources"]]
    assert "k3infra:index:K3ServingStack" in types
    for res in plan["resources"]:
        assert {"type", "name", "parent", "inputs", "dependsOn"} <= set(res)
    docs = [yaml.safe_load(p.read_text()) for p in written]
    assert [d["kind"] for d in docs].count("StatefulSet") == 1
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert isinstance(sts["spec"]["replicas"], int)           # ints as ints, not 1.0
    assert list(sts)[:3] == ["apiVersion", "kind", "metadata"]


def test_plan_keys_are_the_readmes(tmp_path):
    """README "What a render shows" lists plan.json's keys and each resource's."""
    write_render(render("existing", PIN), tmp_path)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert list(plan) == ["stack", "project", "config", "receipt", "resources", "outputs",
                          "warnings"]
    assert list(plan["receipt"]) == ["id", "sha256", "status", "name"]
    assert list(plan["resources"][0]) == ["type", "name", "urn", "parent", "provider",
                                          "dependsOn", "customTimeouts", "inputs"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert ('`DIR/plan.json`: `{"stack", "project", "config", "receipt": {"id", "sha256", '
            '"status", "name"}, "resources": [{"type", "name", "urn", "parent", "provider", '
            '"dependsOn", "customTimeouts", "inputs"}], "outputs", "warnings"}`') in readme


def test_a_render_without_kubernetes_objects_writes_no_manifests_folder(tmp_path):
    """The Docker host: plan.json, compose.yaml and the files of its configs; a stale
    manifests/ is cleared, and so is a config file an earlier render wrote."""
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "001-old.yaml").write_text("kind: Old\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "etc-old-00000000").write_text("old\n")
    assert main(["render", "--stack", "host", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compose.yaml", "configs", "plan.json"]
    files = sorted(p.name for p in (tmp_path / "configs").iterdir())
    assert "etc-old-00000000" not in files
    # 14: the proxy's nginx.conf, the check-lock script, and the weights runtime's 12
    # files (k3infra.weights.RUNTIME_FILES and SHARED_FILES).
    assert len(files) == 14 and files[0].startswith("etc-k3-proxy-nginx-conf-")


def test_parents_and_ordering():
    r = render("existing", PIN)
    by_name = {res["name"]: res for res in r.resources}
    stack_urn = by_name["kimi-k3"]["urn"]
    assert by_name["kimi-k3-serving"]["parent"] == stack_urn
    sts = by_name["kimi-k3-serving-statefulset"]
    assert sts["parent"] == by_name["kimi-k3-serving"]["urn"]
    job_urn = by_name["kimi-k3-weights-job"]["urn"]
    assert job_urn in sts["dependsOn"]                      # serving waits for verified weights
    assert sts["customTimeouts"]["create"].endswith("m")
    assert by_name["kimi-k3-weights-job"]["customTimeouts"]["create"].endswith("m")


def test_stack_outputs(receipt):
    out = render("existing", PIN).outputs
    assert out["receiptId"] == receipt.id
    assert out["engineCommit"] == receipt.engine.commit
    assert out["weightsRevision"] == GOOD_REVISION
    assert out["treeDigest"] == receipt.model.tree_digest
    assert out["endpoint"] == "http://kimi-k3.kimi-k3.svc.cluster.local:8000"
    assert out["servedModelName"] == "kimi-k3"
    assert out["image"].split("@sha256:")[1]
    assert out["licenseName"] == receipt.license.name


def test_secrets_never_written(tmp_path):
    r = render("existing", PIN, f"apiKey={API_KEY}", f"hfToken={HF_TOKEN}")
    write_render(r, tmp_path)
    for path in [tmp_path / "plan.json", *sorted((tmp_path / "manifests").glob("*.yaml"))]:
        text = path.read_text()
        assert API_KEY not in text and HF_TOKEN not in text, path
    secrets = {m["metadata"]["name"]: m for m in r.manifests() if m["kind"] == "Secret"}
    # the key and the proxy's key map (it holds the key); nginx.conf is a ConfigMap's
    assert secrets["kimi-k3-api-key"]["stringData"] == {"api-key": "[secret]",
                                                        "keys.map": "[secret]"}
    assert secrets["kimi-k3-hf-token"]["stringData"] == {"token": "[secret]"}


def test_shipped_secure_values_render_as_placeholders(tmp_path):
    r = render("existing")
    assert r.plan()["config"]["k3:apiKey"] == "[secret]"


def test_cli_render_prints_summary(tmp_path, capsys):
    assert main(["render", "--stack", "existing", "--config", PIN, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for needle in ("vllm serve", "--moe-backend marlin", "HBM", "headroom", "startup budget",
                   "StatefulSet", "placement"):
        assert needle in out
    assert (tmp_path / "plan.json").is_file()


@pytest.mark.parametrize("override, needle", [
    ("weightsRevision=main", "k3:weightsRevision = 'main'"),
    ("gpuProduct=NVIDIA-B200", "175.75 GiB free"),
    ("engineImage=vllm/vllm-openai:latest", "k3:engineImage"),
    ("replicas=0", "k3:replicas"),
])
def test_cli_render_refuses_bad_config(tmp_path, capsys, override, needle):
    assert main(["render", "--stack", "existing", "--config", override,
                 "--out", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert needle in err
    assert not (tmp_path / "plan.json").exists()


def test_render_defaults_to_the_existing_stack_into_build_render(monkeypatch, tmp_path):
    """`k3infra render` alone is `make render`: the existing stack into build/render/existing."""
    import k3infra.render as render_module

    monkeypatch.setattr(render_module, "project_root", lambda: tmp_path)
    seen = {}

    def stop(stack, overrides, root):
        seen["stack"] = stack
        raise FileNotFoundError("stopped before rendering")

    monkeypatch.setattr(render_module, "render_stack", stop)
    assert main(["render"]) == 2
    assert seen == {"stack": "existing"}


def test_unknown_stack(tmp_path, capsys):
    assert main(["render", "--stack", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "known stacks: aws, coreweave, existing, host, nebius, oci" in err


def test_render_reads_the_users_stack_file_before_the_template(tmp_path):
    """`stacks/Pulumi.<stack>.yaml` (the user's copy, with their ciphertext) wins over the
    template in `stacks/examples/`; a `secure:` value there renders as [secret]."""
    import shutil

    from k3infra.render import load_config

    root = tmp_path / "k3"
    shutil.copytree(ROOT / "stacks", root / "stacks")
    raw, secrets = load_config("existing", [], root)
    assert raw["k3:apiKey"] == "[secret]" and "k3:apiKey" in secrets   # templates carry none
    own = (root / "stacks/examples/Pulumi.existing.yaml").read_text().replace(
        "k3:replicas: 1", "k3:replicas: 2") + "  k3:apiKey:\n    secure: v1:abc:def\n"
    (root / "stacks/Pulumi.existing.yaml").write_text(own)
    raw, secrets = load_config("existing", [], root)
    assert raw["k3:replicas"] == 2 and raw["k3:apiKey"] == "[secret]"


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self):
        self.registered = []

    def new_resource(self, args):
        self.registered.append(args)
        return f"{args.name}-id", args.inputs

    def call(self, args):
        return {}


def test_component_importable_from_another_program():
    """`from k3infra import K3ServingStack` in someone else's program, through mocks."""
    import asyncio

    asyncio.set_event_loop(asyncio.new_event_loop())
    mocks = _Mocks()
    pulumi.runtime.set_mocks(mocks, project="other", stack="dev", preview=False)
    from k3infra import K3ServingStack, K3ServingStackArgs

    @pulumi.runtime.test
    def program():
        stack = K3ServingStack("kimi", K3ServingStackArgs(
            weightsRevision=GOOD_REVISION, apiKey=pulumi.Output.secret("sk-x"),
            engineImage="registry.example.com/vllm@sha256:" + "2" * 64,
            serving={"proxyImage": "nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:"
                     + "3" * 64},
            acceptModelLicense=True, namespace="inference", createNamespace=True,
            receipt=load_receipt()))

        def check(values):
            endpoint, image, _, _ = values
            assert endpoint == "http://kimi.inference.svc.cluster.local:8000"
            assert image.endswith("2" * 64)
            types = [a.typ for a in mocks.registered]
            assert "kubernetes:apps/v1:StatefulSet" in types
            assert "kubernetes:batch/v1:Job" in types
        return pulumi.Output.all(stack.endpoint, stack.image, stack.serving.statefulset.urn,
                                 stack.weights.job.urn).apply(check)

    program()


def test_templates_carry_no_ciphertext_and_set_the_required_keys():
    """A `secure:` value is bound to one stack's key: a template's would fail every other
    user's `pulumi preview`. The CLI requires the declared keys without default."""
    from conftest import ALL_STACKS

    assert ALL_STACKS == ["aws", "coreweave", "existing", "host", "nebius", "oci"]
    for stack in ALL_STACKS:
        text = (ROOT / "stacks/examples" / f"Pulumi.{stack}.yaml").read_text()
        assert "secure:" not in text, stack
        assert "k3:weightsRevision:" in text, stack
        assert f"pulumi stack init {stack}" in text and f"cp stacks/examples/Pulumi.{stack}.yaml stacks/" in text


def test_one_engine_build_default_for_the_component_and_the_templates():
    """Issue 33: k3:engine.build unset is prebuilt with k3:engineImage, else in-cluster,
    for K3ServingStackArgs and the stack templates alike (which leave it unset)."""
    import yaml as _yaml

    from conftest import ALL_STACKS, PREBUILT_IMAGE
    from k3infra.config import parse_stack_config

    base = {"weightsRevision": GOOD_REVISION, "apiKey": "k"}
    receipt = load_receipt()
    assert parse_stack_config({**base, "engineImage": PREBUILT_IMAGE},
                              receipt=receipt).engine.build == "prebuilt"
    built = parse_stack_config({**base, "engine": {"registry": "r.example.com/k3/vllm"}},
                               receipt=receipt)
    assert built.engine.build == "in-cluster"
    for stack in ALL_STACKS:
        config = _yaml.safe_load((ROOT / "stacks/examples" / f"Pulumi.{stack}.yaml").read_text())
        assert "build" not in config["config"].get("k3:engine", {}), stack


@pytest.mark.parametrize("stack", ["existing", "aws", "oci", "nebius", "coreweave"])
def test_upstream_profile_on_a_template_needs_only_the_image(stack, tmp_path, capsys):
    """Issue 33, point 4: `profile: upstream` plus the released image, nothing else."""
    from conftest import PREBUILT_IMAGE

    r = render(stack, PIN, "k3:profile=upstream", f"k3:engineImage={PREBUILT_IMAGE}")
    assert r.outputs["engineProfile"].startswith("upstream: ")
    code = main(["render", "--stack", stack, "--config", "profile=upstream",
                 "--out", str(tmp_path)])
    assert code == 2
    assert ("k3:engineImage = None: is required with k3:profile = upstream: a released vLLM "
            "image pinned by digest") in capsys.readouterr().err


def test_the_proxys_config_reads_as_a_file_in_the_render(tmp_path):
    """Issue 27: a render masked the whole API-key Secret, nginx.conf included. The
    config is a ConfigMap now, written as a literal block; the Secret shows no value."""
    import yaml

    r = render("existing", PIN, f"apiKey={API_KEY}")
    write_render(r, tmp_path)
    path = next((tmp_path / "manifests").glob("*-configmap-kimi-k3-proxy.yaml"))
    text = path.read_text()
    assert "  nginx.conf: |\n" in text and "\n    worker_processes 2;\n" in text
    assert "\n            include /etc/k3-proxy/keys.map;\n" in text and API_KEY not in text
    assert yaml.safe_load(text)["data"] == next(
        m for m in r.manifests() if m["metadata"]["name"] == "kimi-k3-proxy")["data"]
    secret = yaml.safe_load(next((tmp_path / "manifests").glob("*-secret-kimi-k3-api-key.yaml"))
                            .read_text())
    assert secret["stringData"] == {"keys.map": "[secret]", "api-key": "[secret]"}


def test_a_refusal_inside_the_program_is_one_line_and_nothing_at_exit():
    """A preflight refusal is raised while the mock monitor's threads hold event loops of
    their own; left open, each printed a BaseEventLoop.__del__ traceback at exit."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "import sys; from k3infra.cli import main; sys.exit(main())",
         "render", "--stack", "aws", "--config", f"weightsRevision={GOOD_REVISION}",
         "--config", "replicas=3"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == ("k3infra render: k3:nodePool.nodeCount = 1: k3:replicas = 3 needs at "
                           "least 3 nodes: one replica is one whole 8-GPU node (TP8), never two "
                           "on one node\n")
