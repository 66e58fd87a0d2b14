"""k3:weights.store: your object store as the weights' origin instead of the Hub.

The config is refused in one line before anything is created (each provider's naming
rules, an endpoint with credentials or plain HTTP without the opt-in, a prefix with
`..`); a rendered stack gives the store's URL to the prefetch Job as its origin, its
credentials only by Secret reference or a ServiceAccount (never a value in the manifest),
no HF token, and egress to the store instead of the Hub; the download phase's rate is the
store's. Expected values are literals."""
import json

import pytest

from k3infra.config import ConfigError, parse_stack_config
from k3infra.fieldtypes import CREDENTIALS_IN_URL
from k3infra.weights import fanout
from k3infra.weights.store import StoreUrl, parse_store_url

from conftest import GOOD_REVISION, container, manifest, render

PIN = f"weightsRevision={GOOD_REVISION}"
JOB = "kimi-k3-weights-prefetch"


def store(**keys) -> str:
    return "weights.store=" + json.dumps(keys)


def config_of(r, receipt):
    return parse_stack_config(r.raw_config, tuple(r.secret_keys), receipt=receipt)


def env_of(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def prefetch(r, name=JOB) -> tuple[dict, dict]:
    pod = manifest(r, "Job", name)["spec"]["template"]
    return pod, pod["spec"]["containers"][0]


@pytest.mark.parametrize("keys,key,accepted", [
    ({"url": "ftp://weights/m"}, "k3:weights.store.url",
     "unknown scheme 'ftp'; accepted s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX] or "
     "az://ACCOUNT/CONTAINER[/PREFIX]"),
    ({"url": "s3://Weights_Bucket/m"}, "k3:weights.store.url",
     "bucket 'Weights_Bucket' must be lowercase letters, digits, '.' and '-', starting and "
     "ending with a letter or digit (the S3 API)"),
    ({"url": "s3://ab/m"}, "k3:weights.store.url", "bucket 'ab' must be 3 to 63 characters (the S3 API)"),
    ({"url": "s3://192.168.5.4/m"}, "k3:weights.store.url",
     "bucket '192.168.5.4' must not be an IP address (the S3 API)"),
    ({"url": "s3://my..bucket"}, "k3:weights.store.url",
     "bucket 'my..bucket' must not hold two adjacent periods (the S3 API)"),
    ({"url": "s3://weights-s3alias"}, "k3:weights.store.url",
     "bucket 'weights-s3alias' must not end with -s3alias, --ol-s3, .mrap, --x-s3, "
     "--table-s3 (reserved by AWS) (the S3 API)"),
    ({"url": "gs://google-weights"}, "k3:weights.store.url",
     "bucket 'google-weights' must not start with 'goog' or contain 'google' (reserved by "
     "Google) (Google Cloud Storage)"),
    ({"url": "gs://-weights"}, "k3:weights.store.url",
     "bucket '-weights' must be lowercase letters, digits, '-', '_' and '.', starting and "
     "ending with a letter or digit (Google Cloud Storage)"),
    ({"url": "az://MyAccount/weights"}, "k3:weights.store.url",
     "account 'MyAccount' must be 3 to 24 lowercase letters and digits (an Azure storage account)"),
    ({"url": "az://account1/we--ights"}, "k3:weights.store.url",
     "container 'we--ights' must be 3 to 63 lowercase letters, digits and single '-' between "
     "them, starting and ending with a letter or digit (an Azure container) (Azure Blob Storage)"),
    ({"url": "az://account1"}, "k3:weights.store.url", "accepted az://ACCOUNT/CONTAINER[/PREFIX]"),
    ({"url": "s3://weights/models/../other"}, "k3:weights.store.url",
     "prefix 'models/../other' must not hold an empty, '.' or '..' component"),
    ({"url": "s3://weights//models"}, "k3:weights.store.url",
     "prefix '/models' must not hold an empty, '.' or '..' component"),
    # Credentials in any URL of the stack are the one rule of k3infra/config/parse.py.
    ({"url": "s3://key:secret@weights/m"}, "k3:weights.store.url", CREDENTIALS_IN_URL),
    ({"url": "s3://weights/m", "endpoint": "https://AKIA:secret@minio.internal:9000"},
     "k3:weights.store.endpoint", CREDENTIALS_IN_URL),
    ({"url": "s3://weights/m", "endpoint": "http://minio.internal:9000"},
     "k3:weights.store.endpoint",
     "is plain HTTP: set k3:weights.store.allowHttp true to choose that (the bytes are still "
     "hashed against the lock; the credentials travel in the clear)"),
    ({"url": "s3://weights/m", "endpoint": "minio.internal:9000"}, "k3:weights.store.endpoint",
     "must be an http(s):// URL"),
    ({"url": "s3://weights/m", "credentialsSecret": "s3-keys", "serviceAccount": "weights-reader"},
     "k3:weights.store",
     "set credentialsSecret or serviceAccount, not both: the prefetch reads the store with "
     "one identity"),
    ({"endpoint": "https://minio.internal"}, "k3:weights.store.url", "is required"),
    ({"url": "s3://weights/m"}, "k3:weights.store",
     "set credentialsSecret (a Secret with the provider's keys) or serviceAccount (the cloud's "
     "workload identity): the prefetch's NetworkPolicy keeps it off the node's metadata service"),
    ({"url": "s3://weights/m", "region": "US East"}, "k3:weights.store.region",
     "must be a region name (lowercase letters, digits, '-' and '_', at most 63)"),
])
def test_a_store_the_provider_would_refuse_is_one_line_before_anything_exists(keys, key, accepted):
    with pytest.raises(ConfigError) as err:
        render("existing", PIN, store(**keys))
    assert err.value.key == key
    assert err.value.accepted == accepted
    assert "\n" not in str(err.value)


def test_names_aws_refuses_are_accepted_by_an_s3_compatible_endpoint():
    """AWS's reserved prefixes and suffixes are AWS's: a MinIO or Ceph bucket may use them."""
    assert parse_store_url("s3://xn--weights/m", aws=False) == StoreUrl("s3", "xn--weights", "m")
    r = render("existing", PIN, store(url="s3://sthree-weights/m", credentialsSecret="k3-store-keys",
                                      endpoint="https://rgw.internal:7480"))
    assert env_of(prefetch(r)[1])["K3_WEIGHTS_SOURCES"] == "s3://sthree-weights/m"


def test_store_urls_parse_into_their_parts():
    assert parse_store_url("s3://k3-weights") == StoreUrl("s3", "k3-weights", "")
    assert parse_store_url("gs://k3_weights.example.com/a/b/") == \
        StoreUrl("gs", "k3_weights.example.com", "a/b")
    url = parse_store_url("az://k3acct/weights/models")
    assert url == StoreUrl("az", "weights", "models", account="k3acct")
    assert str(url) == "az://k3acct/weights/models"
    assert url.tree_key("moonshotai/Kimi-K3", "ab" * 20, "config.json") == \
        f"moonshotai--Kimi-K3/{'ab' * 20}/config.json"
    assert url.lock_key("moonshotai/Kimi-K3", "ab" * 20) == f"moonshotai--Kimi-K3/{'ab' * 20}.lock.json"


def test_the_prefetch_reads_the_store_with_a_secret_by_reference_and_no_hub_token():
    r = render("existing", PIN, "hfToken=hf_secret_value", store(
        url="s3://k3-weights/models", endpoint="https://s3.us-east-2.amazonaws.com",
        region="us-east-2", credentialsSecret="k3-store-keys"))
    pod, c = prefetch(r)
    env = env_of(c)
    assert env["K3_WEIGHTS_SOURCES"] == "s3://k3-weights/models"
    assert env["K3_STORE_ENDPOINT"] == "https://s3.us-east-2.amazonaws.com"
    assert env["K3_STORE_REGION"] == "us-east-2"
    assert "K3_STORE_ALLOW_HTTP" not in env
    assert env["K3_STORE_PARTS_PER_FILE"] == "8"     # 8 x 8 x 16 MiB = 1 GiB of 64 Gi
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "k3-store-keys", "key": "AWS_ACCESS_KEY_ID"}}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": "k3-store-keys",
                                                             "key": "AWS_SECRET_ACCESS_KEY"}}
    assert env["AWS_SESSION_TOKEN"] == {"secretKeyRef": {"name": "k3-store-keys",
                                                         "key": "AWS_SESSION_TOKEN", "optional": True}}
    assert "HF_TOKEN" not in env and "HF_ENDPOINT" not in env
    assert "serviceAccountName" not in pod["spec"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    # Serving pods never see the store or its keys.
    assert not {k for k in env_of(container(r)) if k.startswith(("K3_STORE", "AWS_"))}
    assert "hf_secret_value" not in json.dumps(r.resources)


@pytest.mark.parametrize("url,keys", [
    ("gs://k3-weights/models", {"GOOGLE_SERVICE_ACCOUNT_KEY": None}),
    ("az://k3acct/weights/models", {"AZURE_STORAGE_ACCOUNT_KEY": True, "AZURE_STORAGE_SAS_KEY": True}),
])
def test_each_provider_takes_its_own_keys_from_the_secret(url, keys):
    r = render("existing", PIN, store(url=url, credentialsSecret="k3-store-keys"))
    env = env_of(prefetch(r)[1])
    for key, optional in keys.items():
        ref = {"name": "k3-store-keys", "key": key, **({"optional": True} if optional else {})}
        assert env[key] == {"secretKeyRef": ref}
    assert not {k for k in env if k.startswith("AWS_")}


@pytest.mark.parametrize("url,label,identity", [
    ("s3://k3-weights/models", None, {"to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}],
                                      "ports": [{"port": 80, "protocol": "TCP"}]}),
    ("gs://k3-weights/models", None, {"to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}],
                                      "ports": [{"port": 80, "protocol": "TCP"}]}),
    ("az://k3acct/weights/models", "true", None),
])
def test_workload_identity_is_the_prefetch_pods_service_account(url, label, identity):
    """The Job runs as the ServiceAccount; its policy reaches the node's identity endpoint
    (EKS Pod Identity's agent, GKE's metadata server) and no other link-local address."""
    r = render("existing", PIN, store(url=url, serviceAccount="k3-weights-reader"))
    pod, c = prefetch(r)
    assert pod["spec"]["serviceAccountName"] == "k3-weights-reader"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["metadata"]["labels"].get("azure.workload.identity/use") == label
    assert not {k for k in env_of(c) if k.startswith(("AWS_", "GOOGLE_", "AZURE_"))}
    egress = manifest(r, "NetworkPolicy", JOB)["spec"]["egress"]
    assert egress[2:] == ([identity] if identity else [])
    with_keys = render("existing", PIN, store(url=url, credentialsSecret="k3-store-keys"))
    assert len(manifest(with_keys, "NetworkPolicy", JOB)["spec"]["egress"]) == 2


def test_virtual_hosted_style_names_the_bucket_in_the_endpoint():
    """CoreWeave AI Object Storage takes virtual-hosted requests only (its documentation):
    the endpoint is the bucket's own host, and the pod is told to address it so."""
    r = render("existing", PIN, store(url="s3://k3-weights/models", endpoint="http://k3-weights.cwlota.com",
                                      allowHttp=True, virtualHostedStyle=True,
                                      credentialsSecret="k3-store-keys"))
    env = env_of(prefetch(r)[1])
    assert (env["K3_STORE_ENDPOINT"], env["K3_STORE_VIRTUAL_HOSTED"]) == \
        ("http://k3-weights.cwlota.com", "true")
    with pytest.raises(ConfigError) as err:
        render("existing", PIN, store(url="s3://k3-weights/models", endpoint="https://cwobject.com",
                                      virtualHostedStyle=True, credentialsSecret="k3-store-keys"))
    assert (err.value.key, err.value.accepted) == (
        "k3:weights.store", "virtualHostedStyle needs an endpoint whose host starts with the "
        "bucket, https://k3-weights.<store host>")


def test_plain_http_to_an_endpoint_is_an_explicit_choice():
    r = render("existing", PIN, store(url="s3://k3-weights/models", endpoint="http://10.0.5.9:9000",
                                      allowHttp=True, cidrs=["10.0.5.9/32"],
                                      credentialsSecret="k3-store-keys"))
    env = env_of(prefetch(r)[1])
    assert env["K3_STORE_ENDPOINT"] == "http://10.0.5.9:9000"
    assert env["K3_STORE_ALLOW_HTTP"] == "true"
    policy = manifest(r, "NetworkPolicy", JOB)["spec"]["egress"]
    assert policy[1] == {"to": [{"ipBlock": {"cidr": "10.0.5.9/32"}}],
                         "ports": [{"port": 9000, "protocol": "TCP"}]}


def test_the_prefetch_reaches_the_store_instead_of_the_hub():
    r = render("existing", PIN, store(url="s3://k3-weights/models", credentialsSecret="k3-store-keys"))
    dns, origin = manifest(r, "NetworkPolicy", JOB)["spec"]["egress"]
    assert origin["ports"] == [{"port": 443, "protocol": "TCP"}]
    assert origin["to"][0] == {"ipBlock": {"cidr": "0.0.0.0/0", "except": [
        "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"]}}


def test_node_local_copies_fan_out_from_copy_zero_which_reads_the_store():
    r = render("existing", PIN, "weights.mode=node-local", "replicas=3",
               store(url="gs://k3-weights/models", serviceAccount="k3-weights-reader"))
    sources = {i: env_of(prefetch(r, f"{JOB}-{i}")[1])["K3_WEIGHTS_SOURCES"] for i in range(3)}
    assert sources == {
        0: "gs://k3-weights/models",
        1: "http://kimi-k3-weights-source-0.kimi-k3.svc:8080,gs://k3-weights/models",
        2: "http://kimi-k3-weights-source-0.kimi-k3.svc:8080,gs://k3-weights/models"}


def test_the_download_phase_runs_at_the_stores_rate(receipt):
    """The receipt's 1561.0 GB: from the Hub at downloadGBps 0.5 the prefetch Job may take
    2 x 3122 s + 1800 s; from the store at nodeGBps 2 (the default), 2 x 780.5 s + 1800 s."""
    hub = render("existing", PIN)
    own = render("existing", PIN, store(url="s3://k3-weights/models", credentialsSecret="k3-store-keys"))
    fast = render("existing", PIN, store(url="s3://k3-weights/models", nodeGBps=10,
                                         credentialsSecret="k3-store-keys"))
    assert [fanout.hub_fill_seconds(receipt, config_of(r, receipt)) for r in (hub, own, fast)] == \
        [8044, 3361, 2113]
    plan = fanout.fill_plan(receipt, config_of(own, receipt)).summary()
    assert plan.startswith("1 store pull(s) (copy 0), 0 in-cluster fill(s); expected store bytes "
                           "1561.0 GB = 1x the tree; fill time for 1 copy ~780 s at store 2 GB/s")


def test_a_hub_mirror_and_a_store_together_are_refused():
    with pytest.raises(ConfigError) as err:
        render("existing", PIN, "weights.hubEndpoint=https://hub.internal.example",
               store(url="s3://k3-weights/models", credentialsSecret="k3-store-keys"))
    assert (err.value.key, err.value.accepted) == (
        "k3:weights.hubEndpoint", "has no effect with k3:weights.store: the store is the weights' "
        "origin and no pod reads the Hub; unset one of the two")


def test_a_docker_host_has_no_store():
    with pytest.raises(ConfigError) as err:
        render("host", PIN, store(url="s3://k3-weights/models", credentialsSecret="k3-store-keys"))
    assert err.value.key == "k3:weights.store"


def test_the_node_tiers_store_keys_render_as_the_node_stack_would_set_them(tmp_path):
    """tests/e2e/store_node.py's keys (the S3 server on the node's address in the test's
    network namespace): accepted offline, plain HTTP chosen, egress to that address only."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "e2e"))
    import store_node
    from store_servers import StoreServer

    server = StoreServer("s3", tmp_path, "10.231.0.2", 17070, argv=[])
    assert store_node.stack_keys(server) == (
        ("--path", "k3:weights.store.url", "s3://weights/models"),
        ("--path", "k3:weights.store.endpoint", "http://10.231.0.2:17070"),
        ("--path", "k3:weights.store.allowHttp", "true"),
        ("--path", "k3:weights.store.region", "us-east-1"),
        ("--path", "k3:weights.store.credentialsSecret", "k3-store-keys", "--plaintext"),
        ("--path", "k3:weights.store.cidrs[0]", "10.231.0.2/32"))
    r = render("existing", PIN, f"weights.store={json.dumps(store_node.store_config(server))}")
    pod, c = prefetch(r)
    env = env_of(c)
    assert env["K3_WEIGHTS_SOURCES"] == "s3://weights/models"
    assert (env["K3_STORE_ENDPOINT"], env["K3_STORE_ALLOW_HTTP"]) == ("http://10.231.0.2:17070", "true")
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "k3-store-keys",
                                                         "key": "AWS_ACCESS_KEY_ID"}}
    assert manifest(r, "NetworkPolicy", JOB)["spec"]["egress"][1] == {
        "to": [{"ipBlock": {"cidr": "10.231.0.2/32"}}], "ports": [{"port": 17070, "protocol": "TCP"}]}
    assert store_node.secret("kimi-k3")["stringData"].keys() == {"AWS_ACCESS_KEY_ID",
                                                                 "AWS_SECRET_ACCESS_KEY"}
    assert store_node.refusal("model.safetensors").search(
        "  model.safetensors: wrong hash: sha256 " + "a" * 64 + ", the lock says " + "b" * 64
        + " after 3 download(s); deleted")


def test_the_pod_runtime_refuses_a_store_source_in_one_line(tmp_path, capsys):
    """`python3 -m k3weights prefetch --sources s3://...` (K3_WEIGHTS_SOURCES in the Job):
    a store URL the provider would refuse is exit 2 and one line, before anything is read."""
    from k3infra.weights import tree as t
    from k3infra.weights.__main__ import PROG, main
    from k3infra.weights.sources import parse_sources

    assert parse_sources("s3://k3-weights/models,hub") == ["s3://k3-weights/models", "hub"]
    lock = tmp_path / "lock.json"
    lock.write_text(t.lock_to_json(t.make_lock("moonshotai/Kimi-K3", GOOD_REVISION, [])))
    code = main(["prefetch", "--lock", str(lock), "--dest", str(tmp_path / "tree"),
                 "--sources", "s3://Bad_Bucket/models"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [
        f"{PROG} prefetch: source 's3://Bad_Bucket/models': bucket 'Bad_Bucket' must "
        "be lowercase letters, digits, '.' and '-', starting and ending with a letter or digit "
        "(the S3 API)"]
    assert not (tmp_path / "tree").exists()


def test_the_read_window_fits_the_prefetch_containers_memory():
    """8 files x parts in flight x 16 MiB stays within a quarter of the memory limit: a
    2 Gi container (the node tier's) reads 4 parts per file at once (512 MiB), 1 Gi 2."""
    def parts(limit):
        r = render("existing", PIN, store(url="s3://k3-weights/models", credentialsSecret="k3-store-keys"),
                   "weights.prefetchResources.memoryGi=0.5", f"weights.prefetchResources.memoryLimitGi={limit}")
        return env_of(prefetch(r)[1])["K3_STORE_PARTS_PER_FILE"]

    assert [parts(2), parts(1), parts(0.5)] == ["4", "2", "1"]


def test_the_read_window_takes_the_request_where_the_memory_limit_is_null():
    """memoryLimitGi null (the limit is the request, ContainerResources.memory_max_gi): the
    window is sized by memoryGi, not a TypeError in the render."""
    r = render("existing", PIN, store(url="s3://k3-weights/models", credentialsSecret="k3-store-keys"),
               'weights.prefetchResources={"memoryGi": 2, "memoryLimitGi": null}')
    c = prefetch(r)[1]
    assert env_of(c)["K3_STORE_PARTS_PER_FILE"] == "4"
    assert c["resources"]["limits"]["memory"] == "2Gi"


# ---- issue 48: the store client's bounds, from one place (store.open_store) ----------------

@pytest.mark.parametrize("url, options, plain", [
    ("s3://weights/m", {"endpoint": "http://10.0.5.9:9000", "allow_http": True}, "true"),
    ("s3://weights/m", {"endpoint": "https://s3.example.com", "allow_http": True}, "false"),
    ("s3://weights/m", {"allow_http": True}, "false"),
    ("gs://weights/m", {"endpoint": "http://10.0.5.9:4443", "allow_http": True}, "true"),
    ("az://acct/weights", {}, "false"),
])
def test_every_store_client_gets_timeouts_and_plain_http_only_for_the_named_endpoint(
        url, options, plain):
    from k3infra.weights import store as st

    handle = st.open_store(st.parse_store_url(url, aws=False), st.StoreOptions(**options))
    client = {k: str(v) for k, v in handle.client_options.items()}
    assert client == {"allow_http": plain, "timeout": st.PART_TIMEOUT,
                      "connect_timeout": st.CONNECT_TIMEOUT}


def test_the_mirror_reads_an_object_only_to_the_locks_size_and_hashes_it(monkeypatch, tmp_path):
    """`mirror --check` reads what it judges through the prefetch's ranged reader: never
    past the lock's size (no whole-object GET), each part within the client's timeout."""
    import hashlib

    import obstore
    from obstore.store import MemoryStore

    from k3infra.weights import store as st
    from k3infra.weights import tree
    from k3infra.weights.mirror import mirror

    data = b"w" * 5000
    lock = tree.make_lock("o/m", "a" * 40, [tree.FileEntry("w.bin", len(data),
                                                           hashlib.sha256(data).hexdigest())])
    url, memory = st.parse_store_url("s3://weights/m"), MemoryStore()
    key = url.tree_key("o/m", "a" * 40, "w.bin")
    obstore.put(memory, key, b"x" * len(data))           # the lock's size, other bytes
    monkeypatch.setenv(st.PART_BYTES_ENV, "2048")
    ranges, bodies = [], []
    real_range, real_get = obstore.get_range, obstore.get
    monkeypatch.setattr(obstore, "get_range", lambda s, k, *, start, end: (
        ranges.append((k, start, end)) or real_range(s, k, start=start, end=end)))
    monkeypatch.setattr(obstore, "get", lambda s, k, options=None: (
        bodies.append(k) if not (options or {}).get("head") else None) or real_get(s, k, options=options))
    report = mirror(lock, url, store=memory, check=True, dry_run=True, emit=None)
    wrong = hashlib.sha256(b"x" * len(data)).hexdigest()
    assert [str(p) for p in report.problems] == [
        f"w.bin: wrong hash: sha256 {wrong}, the lock says {lock.files[0].sha256}"]
    assert ranges == [(key, 0, 2048), (key, 2048, 4096), (key, 4096, 5000)]
    assert bodies == []                                   # no unbounded GET of a body
    # The lock beside the tree: read only when it is the lock's size, and no further.
    big = b"{" * (1 << 20)
    obstore.put(memory, url.lock_key("o/m", "a" * 40), big)
    ranges.clear()
    obstore.put(memory, key, data)
    report = mirror(lock, url, store=memory, check=True, emit=None)
    assert report.ok and report.lock_written and ranges == [(key, 0, 2048), (key, 2048, 4096),
                                                             (key, 4096, 5000)]
    assert bodies == []
