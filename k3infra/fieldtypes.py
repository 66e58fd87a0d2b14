"""The value types of every checked key: full-match patterns and physical bounds, once.

One type per kind of value (a commit, an image pinned by digest, a DNS label, a count of
GiB...), used by every key of that kind: the config (k3infra/config), the receipt, the
policies and the live checks. A new key picks a type and cannot forget its check.

Patterns are matched whole (`re.fullmatch`): a `$`-anchored `re.match` accepts a value
with a trailing newline, and `apiKey\\n` in the proxy's key map locks every user out.
Numbers are bounded above as well as below: 10^23 replicas, `inf` GB/s or 1e-300 GB/s
(a divisor) are not deployments but crashes or hour-long renders. The bounds are
physical ceilings (what one node, one cluster or one Kubernetes field can hold), not
guesses at what is sensible.

Low module: imports nothing from k3infra but podcommon (standard library only).
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from k3infra.podcommon import credentials_in_url

# Any string of any key: at most this many characters, no control character (a newline,
# a NUL, an escape), whatever the key's own type. parse.py checks every value with it.
MAX_STRING = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# Credentials inside a URL: the rule is podcommon's (the pod runtime holds its flags to
# it too); the stack keys' refusal says where they would show and names the Secret keys.
CREDENTIALS_IN_URL = credentials_in_url(
    "plan.json, the pods' env and compose.yaml",
    "as a secret (`pulumi config set --secret`; for the Hub or a Hub mirror, k3:hfToken, "
    "which the pods read from a Kubernetes Secret; for an object store, "
    "k3:weights.store.credentialsSecret or serviceAccount)")


def string_problem(value: str) -> str | None:
    """Why `value` cannot be any config string, or None."""
    if len(value) > MAX_STRING:
        return f"is {len(value)} characters long; at most {MAX_STRING} are accepted"
    bad = _CONTROL.search(value)
    if bad:
        return (f"contains the control character {bad.group()!r} at offset {bad.start()}: "
                "no key accepts a newline, tab, NUL or escape (a YAML block scalar or "
                "`echo` adds a trailing newline)")
    return None


class FullMatch:
    """A whole-value pattern: `regex` compiled as given and matched with fullmatch."""

    def __init__(self, regex: str, accepted: str, max_length: int | None = None):
        if regex.startswith("^") or regex.endswith("$"):
            raise ValueError(f"{regex!r}: give the pattern without ^/$ (it is full-matched)")
        self.regex = regex
        self.compiled = re.compile(regex)
        self.anchored = re.compile(r"\A(?:" + regex + r")\Z")   # for callers that .match()
        self.accepted, self.max_length = accepted, max_length

    def matches(self, value: Any) -> bool:
        return (isinstance(value, str) and self.compiled.fullmatch(value) is not None
                and (self.max_length is None or len(value) <= self.max_length))

    def __call__(self, value: str) -> str:
        if not self.matches(value):
            raise ValueError(self.accepted)
        return value


@dataclass(frozen=True)
class Accepted:
    """What a type accepts, in words, where its check cannot say it (a function): read by
    the key reference (k3infra/config/reference.py); pydantic ignores it."""

    text: str


def pattern(regex: str, accepted: str, max_length: int | None = None):
    """A `str` type that holds only full matches of `regex` (pydantic: ValueError(accepted))."""
    check = FullMatch(regex, accepted, max_length)
    return Annotated[str, AfterValidator(check)], check


def _no_bool(value: Any) -> Any:
    # pydantic's lax mode reads `true` as 1: a switch is never a count.
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")
    return value


def integer(ge: int, le: int):
    """An int within [ge, le]; booleans and floats with a fraction are refused."""
    return Annotated[int, BeforeValidator(_no_bool), Field(ge=ge, le=le)]


def number(ge: float | None = None, le: float | None = None, *, gt: float | None = None):
    """A finite float within its bounds (inf and nan are refused)."""
    return Annotated[float, BeforeValidator(_no_bool),
                     Field(ge=ge, gt=gt, le=le, allow_inf_nan=False)]


# ---- patterns ---------------------------------------------------------------------------

HEX40 = r"[0-9a-f]{40}"
HEX64 = r"[0-9a-f]{64}"
Commit, COMMIT = pattern(HEX40, "must be a 40-hex commit (lowercase); a branch or tag such "
                         "as 'main' is never accepted: the receipt pins bytes")
# The Hub revision of the weights: the same form, said in the Hub's words.
HubCommit, HUB_COMMIT = pattern(HEX40, "must be a 40-hex Hub commit (lowercase); a branch or "
                                "tag such as 'main' is never accepted: the receipt pins bytes")
Sha256Hex, SHA256_HEX = pattern(HEX64, "must be 64 lowercase hex characters (a SHA-256)")
Sha256Digest, SHA256_DIGEST = pattern("sha256:" + HEX64, "must be sha256:<64 lowercase hex>")
DIGEST_IMAGE_REGEX = r"[a-z0-9][a-z0-9._/:-]*@sha256:" + HEX64
DigestImage, DIGEST_IMAGE = pattern(DIGEST_IMAGE_REGEX, "must be pinned by digest: "
                                    "<repository>[:<tag>]@sha256:<64 hex>", 512)
DNS_LABEL_REGEX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DnsLabel, DNS_LABEL = pattern(DNS_LABEL_REGEX, "must be a DNS label (at most 63 lowercase "
                              "letters, digits and '-', starting and ending alphanumeric)", 63)
DnsSubdomain, DNS_SUBDOMAIN = pattern(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?",
                                      "must be a DNS subdomain (at most 253 lowercase letters, "
                                      "digits, '-' and '.')", 253)
# RFC 6750 bearer token (b64token): what the serving proxy compares byte for byte.
ApiKeyText, API_KEY = pattern(r"[A-Za-z0-9._~+/-]+=*", "must be an RFC 6750 bearer token: "
                              "letters, digits and -._~+/ with optional trailing '=' "
                              "(openssl rand -hex 32 makes one)", 1024)
Repository, REPOSITORY = pattern(r"[a-z0-9][a-z0-9._-]*(:[0-9]+)?(/[a-z0-9._-]+)+",
                                 "must be a repository without tag or digest, such as "
                                 "registry.example.com/k3/vllm", 255)
DockerTag, DOCKER_TAG = pattern(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}",
                                "must be a Docker tag: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
RegistryHost, REGISTRY_HOST = pattern(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?",
                                      "must be a registry host[:port] (lowercase, no "
                                      "scheme, no path), such as registry.lan:5000", 260)
GitUrl, GIT_URL = pattern(r"(https://|ssh://|git@)[^\s]+", "must be an https://, ssh:// or "
                          "git@ Git URL", 2048)
HttpUrl, HTTP_URL = pattern(r"https?://[^\s/]+(/[^\s]*)?", "must be an http(s):// URL", 2048)
LABEL_KEY_REGEX = (r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?"
                   r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
LabelKey, LABEL_KEY = pattern(LABEL_KEY_REGEX, "must be a Kubernetes label key "
                              "([prefix/]name, the name at most 63 characters)", 317)
LabelValue, LABEL_VALUE = pattern(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?",
                                  "must be a Kubernetes label value (at most 63 letters, "
                                  "digits, '-', '_', '.')", 63)
EnvName, ENV_NAME = pattern(r"[A-Z_][A-Z0-9_]*", "must be an environment variable name "
                            "([A-Z_][A-Z0-9_]*)", 128)
Flag, FLAG = pattern(r"--[a-z0-9][a-z0-9-]*", "must be a long option (--name)", 128)
ScrapeInterval, SCRAPE_INTERVAL = pattern(r"[1-9][0-9]{0,3}(s|m)", "must be a duration such as "
                                          "30s or 1m (1-9999 s or m)")
CronField, CRON = pattern(r"[0-9A-Za-z*/,?-]+( [0-9A-Za-z*/,?-]+){4}|disabled",
                          "must be a 5-field cron schedule (minute hour day month weekday) or "
                          "'disabled'", 128)
Version, VERSION = pattern(r"[0-9]+\.[0-9]+\.[0-9]+([.+-][0-9A-Za-z.]+)?",
                           "must be a release version such as 0.33.0", 64)
ServedModelName, SERVED_MODEL_NAME = pattern(r"[A-Za-z0-9][A-Za-z0-9._/:-]*",
                                             "must be a model name: letters, digits and "
                                             "._/:- (what clients send as `model`)", 256)
AbsPath, ABS_PATH = pattern(r"/[A-Za-z0-9._/-]*", "must be an absolute path of letters, digits "
                            "and ._/- without '..'", 1024)
# A path a stack names (k3:weights.lockFile): relative to the checkout or absolute.
FilePath, FILE_PATH = pattern(r"[A-Za-z0-9._/+@-]+", "must be a file path of letters, digits "
                              "and ._/+@-", 1024)


def _labels(value: dict) -> dict:
    # Checked as a whole, so a refusal names the key (k3:network.allowFromPodLabels) and
    # the message the label.
    for key, val in value.items():
        if not LABEL_KEY.matches(key):
            raise ValueError(f"{key!r} is not a Kubernetes label key ([prefix/]name, the name "
                             "at most 63 characters)")
        if not LABEL_VALUE.matches(val):
            raise ValueError(f"{key}={val!r}: not a Kubernetes label value (a string of at "
                             "most 63 letters, digits, '-', '_', '.')")
    return value


# Link-local: the instance metadata services (169.254.169.254, fd00:ec2::254 is inside
# fc00::/7) and NodeLocal DNS. Never reachable through a CIDR a user lists, save DNS's
# (k3infra.netpol cuts these ranges out of every ipBlock that contains them).
LINK_LOCAL_CIDRS = ("169.254.0.0/16", "fe80::/10")


def _cidr(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise ValueError(f"{value!r} is not a CIDR (address/prefix with no host bits)") from None
    return value


def _routable_cidr(value: str) -> str:
    """A CIDR inside a link-local range would open only the metadata service (or NodeLocal
    DNS, which k3:network.dnsCidrs takes): refused."""
    net = ipaddress.ip_network(_cidr(value))
    for link_local in map(ipaddress.ip_network, LINK_LOCAL_CIDRS):
        if net.version == link_local.version and net.subnet_of(link_local):
            raise ValueError(f"lies inside the link-local {link_local} (node-local endpoints "
                             f"such as the instance metadata service); accepted: a CIDR outside "
                             f"{' and '.join(LINK_LOCAL_CIDRS)} (one containing them gets them "
                             f"cut out; k3:network.dnsCidrs alone takes NodeLocal DNS's)")
    return value


def ip_address(value: str):
    """`value` parsed (ipaddress), an IPv4-mapped IPv6 address (::ffff:a.b.c.d) as the IPv4
    address it carries and a zone (%eth0) dropped: what a socket binds, whatever the
    spelling. ValueError if it is no address."""
    addr = ipaddress.ip_address(value.split("%", 1)[0] if "%" in value else value)
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped if mapped is not None else addr


def is_wildcard(value: str) -> bool:
    """True for every spelling of "all addresses": 0.0.0.0, ::, ::ffff:0.0.0.0, 0::0,
    ::%eth0... (a bind to any of them listens on every interface)."""
    return ip_address(value).is_unspecified


def _ip(value: str) -> str:
    try:
        ip_address(value)
    except ValueError:
        raise ValueError("must be an IP address") from None
    return value


Cidr = Annotated[str, Field(max_length=64), AfterValidator(_routable_cidr),
                 Accepted(f"a CIDR (address/prefix, no host bits) outside "
                          f"{' and '.join(LINK_LOCAL_CIDRS)}")]
# k3:network.dnsCidrs only: NodeLocal DNSCache listens on a link-local address (port 53).
DnsCidr = Annotated[str, Field(max_length=64), AfterValidator(_cidr),
                    Accepted("a CIDR (address/prefix, no host bits)")]
Labels = Annotated[dict[str, str], AfterValidator(_labels),
                   Accepted("Kubernetes labels (label key: label value)")]
IpAddress = Annotated[str, Field(max_length=64), AfterValidator(_ip), Accepted("an IP address")]

# ---- bounds -----------------------------------------------------------------------------
# Ceilings: what one Kubernetes object, one node or one cluster can hold.
Port = integer(1, 65535)
UnprivilegedPort = integer(1024, 65535)
Seed = integer(0, 2**32 - 1)                    # numpy / vLLM seeds are 32-bit
Replicas = integer(1, 1024)                     # each replica is a whole 8-GPU node
Seconds = integer(0, 7 * 86400)                 # a week: longer than any deadline we set
Gi = integer(1, 1 << 20)                        # 1 PiB: past every volume and node
Count = integer(0, 1 << 20)                     # requests, items, thresholds
GBps = number(0.001, 10_000)                    # a rate, used as a divisor: never ~0 or inf
GB = number(0.001, 1e9)                         # decimal GB (1 EB)
Percent = number(0, 1000)
Factor = number(1.0, 100.0)
