"""Stack config: every bad value fails before any resource exists, naming the key,
the value and what is accepted."""
import pytest

from k3infra.config import ConfigError, Secret, apply_override, parse_stack_config
from k3infra.hbm import HbmError, hbm_fit
from k3infra.receipt import load_receipt

from conftest import GOOD_REVISION

IMAGE = "registry.example.com/k3/vllm@sha256:" + "ab" * 32
BASE = {"k3:weightsRevision": GOOD_REVISION, "k3:apiKey": "sk-test", "k3:engineImage": IMAGE}


def cfg(**changes):
    raw = dict(BASE)
    for k, v in changes.items():
        if v is None:
            raw.pop(f"k3:{k}", None)
        else:
            raw[f"k3:{k}"] = v
    return parse_stack_config(raw, receipt=load_receipt())


def test_good_config_and_defaults():
    c = cfg(replicas="2", serving='{"shmSizeGi": 32}', acceptModelLicense="true")
    assert c.replicas == 2 and c.serving.shm_size_gi == 32 and c.accept_model_license is True
    assert c.gpu_product == load_receipt().hardware.gpu_product_label
    assert isinstance(c.api_key, Secret) and "sk-test" not in repr(c.api_key)


BAD = [
    ("weightsRevision", "main", "k3:weightsRevision", "40-hex"),
    ("weightsRevision", "release-1", "k3:weightsRevision", "40-hex"),
    ("weightsRevision", "3f1c2b4", "k3:weightsRevision", "40-hex"),
    ("weightsRevision", None, "k3:weightsRevision", "required"),
    ("engineImage", "vllm/vllm-openai:latest", "k3:engineImage", "digest"),
    ("engineImage", "vllm/vllm-openai:v0.33.0", "k3:engineImage", "digest"),
    ("engineImage", None, "k3:engineImage", "required"),
    ("replicas", "0", "k3:replicas", "greater than or equal to 1"),
    ("replicas", "two", "k3:replicas", "integer"),
    ("profile", "fast", "k3:profile", "'measured', 'upstream' or 'custom'"),
    ("apiKey", None, "k3:apiKey", "required"),
    ("weightsRevisoin", GOOD_REVISION, "k3:weightsRevisoin", "not a known key"),
    ("surface", '{"args": {"--max-num-seqs": "64"}}', "k3:surface.args.--max-num-seqs",
     "profile = custom", "'64'"),
    ("surface", '{"args": {"--block-size": "16"}}', "k3:surface.args.--block-size",
     "allow-listed", "'16'"),
    ("surface", '{"env": {"NCCL_ALGO": "Ring"}}', "k3:surface.env.NCCL_ALGO", "allow-listed", "'Ring'"),
    ("surface", '{"env": {"VLLM_API_KEY": "sk-x"}}', "k3:surface.env.VLLM_API_KEY", "secret", '[secret]'),
    ("surface", '{"args": {"--enable-auto-tool-choice": "yes"}}',
     "k3:surface.args.--enable-auto-tool-choice", "switch", "'yes'"),
    ("custom", '{"args": ["--max-num-seqs", "64"]}', "k3:custom", "profile = custom", '--max-num-seqs'),
    ("weights", '{"mode": "nfs"}', "k3:weights.mode", "'shared' or 'node-local'", "'nfs'"),
    ("weights", '{"nodeLocalRoot": "mnt/weights"}', "k3:weights.nodeLocalRoot", "absolute", "'mnt/weights'"),
    ("weights", '{"nodeLocalRoot": "/var/lib/kubelet"}', "k3:weights.nodeLocalRoot", "under /mnt/",
     "'/var/lib/kubelet'"),
    ("weights", '{"nodeLocalRoot": "/mnt"}', "k3:weights.nodeLocalRoot", "under /mnt/", "'/mnt'"),
    ("weights", '{"gateMode": "trust"}', "k3:weights.gateMode", "'warm' or 'stamps'", "'trust'"),
    ("weights", '{"auditSchedule": "daily"}', "k3:weights.auditSchedule", "5-field cron", "'daily'"),
    ("serving", '{"storageReadGBps": 0}', "k3:serving.storageReadGBps", "greater than or equal to 0.001", '= 0:'),
    ("serving", '{"shmSize": 64}', "k3:serving.shmSize", "not a known key", '= 64:'),
    ("namespace", "K3_Prod", "k3:namespace", "DNS label"),
    ("namespace", "a" * 64, "k3:namespace", "DNS label", "'" + "a" * 64 + "'"),
    ("serving", '{"port": ', "k3:serving", "JSON", '{"port": '),
]


@pytest.mark.parametrize("case", BAD, ids=[f"{b[0]}={b[1]}" for b in BAD])
def test_bad_config_names_key_value_and_accepted(case):
    key, value, named, accepted = case[:4]
    shown = case[4] if len(case) > 4 else (repr(value) if value is not None else "None")
    with pytest.raises(ConfigError) as info:
        cfg(**{key: value})
    msg = str(info.value)
    assert msg.startswith(named), msg
    assert accepted in msg, msg
    assert shown in msg, msg


def test_custom_profile_accepts_engine_path_changes():
    c = cfg(profile="custom", custom='{"args": ["--max-num-seqs", "64"]}')
    assert c.custom.args == ["--max-num-seqs", "64"]


def test_secret_value_never_in_error():
    with pytest.raises(ConfigError) as info:
        parse_stack_config({**BASE, "k3:hfToken": ["hf_SECRETSECRET"], "k3:replicas": "x"}, receipt=load_receipt())
    assert "hf_SECRET" not in str(info.value)


def test_override_dotted_paths():
    raw = {"k3:weights": {"mode": "shared"}}
    apply_override(raw, "weights.mode=node-local")
    apply_override(raw, "k3:benchmark.enabled=true")
    apply_override(raw, "replicas=2")
    assert raw == {"k3:weights": {"mode": "node-local"}, "k3:benchmark": {"enabled": True},
                   "k3:replicas": "2"}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        apply_override(raw, "replicas")


# --- HBM fit ---------------------------------------------------------------------------

def test_b300_headroom(receipt):
    fit = hbm_fit(receipt, "NVIDIA-B300-SXM6-AC")
    assert fit.headroom_gib == pytest.approx(267.69 - 175.40)


def test_b200_is_refused_with_the_measured_figures(receipt):
    with pytest.raises(HbmError) as info:
        hbm_fit(receipt, "NVIDIA-B200")
    msg = str(info.value)
    assert msg.startswith("k3:gpuProduct = 'NVIDIA-B200'")
    for figure in ("175.40 GiB", "175.75 GiB free", "178.35 GiB"):
        assert figure in msg


def test_gb300_four_gpu_nodes_are_refused(receipt):
    with pytest.raises(HbmError, match="span 2 nodes"):
        hbm_fit(receipt, "NVIDIA-GB300")


def test_unknown_gpu_needs_its_memory(receipt):
    with pytest.raises(HbmError, match="k3:gpuMemoryGib"):
        hbm_fit(receipt, "NVIDIA-X1000")
    assert hbm_fit(receipt, "NVIDIA-X1000", 300.0).headroom_gib == pytest.approx(124.6)
    with pytest.raises(HbmError, match="does not fit"):
        hbm_fit(receipt, "NVIDIA-X1000", 141.0)


def test_pulumi_yaml_declared_keys_required_or_defaulted_as_the_model():
    """The CLI treats a declared key without `default:` as required in every stack: only
    the keys the model itself requires may be declared so; declared defaults equal the
    model's. (The CLI's own check runs in tests/e2e/test_engine.py.)"""
    import yaml

    from k3infra.config import StackConfig
    from conftest import ROOT

    declared = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]
    fields = {f.alias or n: f for n, f in StackConfig.model_fields.items()}
    required = {k for k, f in fields.items() if f.is_required()}
    assert required == {"weightsRevision", "apiKey"}
    for key, decl in declared.items():
        assert key in fields, key
        assert decl.get("description"), key
        if "default" in decl:
            assert decl["default"] == fields[key].default, key
        else:
            assert key in required, f"{key}: declared without default = required by the CLI"
    assert required <= set(declared)
    assert declared["apiKey"]["secret"] is True


def test_a_custom_receipt_validates_against_itself(tmp_path):
    """Defaults and allow-lists come from the receipt passed in, not the shipped one."""
    from k3infra.receipt import receipt_path

    text = receipt_path().read_text().replace("concurrencies: [1, 8]", "concurrencies: [1, 4, 16]", 1)
    custom_file = tmp_path / "custom.yaml"
    custom_file.write_text(text)
    custom = load_receipt(str(custom_file))
    raw = {"k3:weightsRevision": "a" * 40, "k3:apiKey": "x", "k3:engineImage": "r@sha256:" + "1" * 64}
    assert parse_stack_config(raw, receipt=custom).benchmark.concurrencies == [1, 4, 16]
    assert parse_stack_config(raw, receipt=load_receipt()).benchmark.concurrencies == [1, 8]
