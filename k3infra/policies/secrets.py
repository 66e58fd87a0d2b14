"""No literal secrets in pod specs: tokens and keys come from Secrets via secretKeyRef."""
from __future__ import annotations

import re
from typing import Optional

from pulumi_policy import (EnforcementLevel, PolicyConfigSchema, ReportViolation,
                           ResourceValidationArgs, ResourceValidationPolicy)

from k3infra.policies.workloads import get, items, kind_of, mapping, workloads

from k3infra.policies import stack_config
_receipt = stack_config.receipt  # the stack's receipt (k3:receipt), read when a policy runs

# Shapes of credentials that must never appear as plain text.
TOKEN_PATTERNS = {
    "Hugging Face token": r"\bhf_[A-Za-z0-9]{30,}\b",
    "OpenAI-style API key": r"\bsk-[A-Za-z0-9_-]{20,}",
    "AWS access key id": r"\b(AKIA|ASIA)[0-9A-Z]{16}\b",
    "GitHub token": r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",
    "Slack token": r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
    "private key": r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
}
# Env-name words that mark a credential (whole words of NAME_LIKE_THIS).
SECRET_WORDS = {"TOKEN", "KEY", "APIKEY", "PASSWORD", "PASSWD", "SECRET", "CREDENTIALS"}
# ...unless the variable names a file or directory holding it (the recommended way).
FILE_WORDS = {"PATH", "FILE", "DIR"}
# Flags whose value is a credential (vLLM's --api-key; HF's CLI --token).
SECRET_FLAGS = {"--api-key", "--hf-token", "--token", "--password"}
_SWITCH_VALUES = {"", "0", "1", "true", "false", "yes", "no", "on", "off"}


def secret_named(name: str) -> bool:
    words = re.split(r"[_\-.]", name.upper())
    return bool(SECRET_WORDS & set(words)) and not (FILE_WORDS & set(words[-1:]))


def token_match(text: str, extra: list[str]) -> Optional[str]:
    for label, pattern in [*TOKEN_PATTERNS.items(), *((f"pattern {p!r}", p) for p in extra)]:
        if re.search(pattern, text):
            return label
    return None


def _validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    extra = [str(p) for p in items(args.get_config().get("extraPatterns"))]
    kind = kind_of(args.resource_type)
    if kind == "ConfigMap":
        for key, text in mapping(get(args.props, "data")).items():
            label = token_match(str(text), extra)
            if label:
                report(f"ConfigMap {get(args.props, 'metadata', 'name')} key {key}: holds a "
                       f"literal {label}; put it in a Secret", None)
        return
    for wl in workloads(args.resource_type, args.props):
        for c in wl.containers():
            where = f"{wl.kind} {wl.name} container {c.name}"
            for entry in c.env():
                name, literal = str(get(entry, "name")), get(entry, "value")
                ref = get(entry, "valueFrom")
                if literal is not None:
                    label = token_match(str(literal), extra)
                    if label:
                        report(f"{where}: env {name} holds a literal {label}", None)
                    elif secret_named(name) and str(literal).lower() not in _SWITCH_VALUES:
                        report(f"{where}: env {name} is a credential with a literal value; use "
                               "valueFrom.secretKeyRef", None)
                elif secret_named(name) and ref is not None and get(ref, "secretKeyRef") is None:
                    report(f"{where}: env {name} is a credential read from "
                           f"{', '.join(mapping(ref))}, not from a Secret (secretKeyRef)", None)
            words = c.tokens()
            for i, word in enumerate(words):
                flag, eq, inline = word.partition("=")
                if flag in SECRET_FLAGS and (eq or i + 1 < len(words)):
                    value = inline if eq else words[i + 1]
                    if not value.startswith("$"):
                        report(f"{where}: {flag} is given on the command line; pass the "
                               "credential through env from a Secret", None)
                label = token_match(word, extra)
                if label:
                    report(f"{where}: command/args hold a literal {label}", None)


no_literal_secrets = ResourceValidationPolicy(
    name="k3-no-literal-secrets",
    description=("No credential is written into a pod spec or ConfigMap: no Hugging Face token "
                 "(`hf_...`), API key or cloud key pattern in env, command or args, no literal "
                 "value in a variable named *TOKEN*/*KEY*/*PASSWORD*/*SECRET*, no --api-key on "
                 "the command line. The vLLM API key and the HF token (needed if "
                 f"{_receipt().model.repo} becomes gated) come from Secrets via secretKeyRef, so they "
                 "stay out of manifests, logs and Pulumi state."),
    validate=_validate,
    enforcement_level=EnforcementLevel.MANDATORY,
    config_schema=PolicyConfigSchema(properties={
        "extraPatterns": {
            "type": "array", "items": {"type": "string"}, "default": [],
            "description": "further regular expressions of your organisation's token formats"}}),
)

POLICIES = [no_literal_secrets]
