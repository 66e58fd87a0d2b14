"""A generated model that fits a CPU test machine: a random-weight Mixtral-style MoE
(so `--enable-expert-parallel` is on the serve line) with a byte-level BPE tokenizer
trained offline, written by the real libraries (torch, transformers, tokenizers,
safetensors) as a Hub repo would hold it: bf16 safetensors in SHARDS shards plus
`model.safetensors.index.json`, config.json, generation_config.json, tokenizer.json and
tokenizer_config.json with a chat template (vLLM's chat endpoint and lm-eval need one).

Deterministic for a seed on one interpreter and library set: the weights come from
torch's seeded CPU generator, the tokenizer from a fixed list of the interpreter's own
standard-library files (not the repo's files, whose every commit would change the tree).

Generating needs torch and transformers, so it runs under the vLLM CPU venv:
    /work/vllm-cpu/bin/python -m tests.e2e.tiny_moe generate OUT_DIR [--seed N]
The model's receipt is written from the TEMPLATE beside it (receipts/) and the lock of
the generated tree, computed by `k3infra weights lock` (never typed), under the
project's venv:
    .venv/bin/python -m tests.e2e.tiny_moe receipt MODEL_DIR --revision HEX40 --out DIR

In an e2e (the Hub on the namespace's address, the stack on the test receipt):
    files = hub_loopback.read_tree(model_dir)
    revision = hub_loopback.tree_commit(files)
    hub = hub_loopback.serve(model_dir, tiny_moe.REPO, revision, host=address)
    receipt, lock = tiny_moe.write_receipt(model_dir, revision, out_dir)
    named = tiny_moe.in_project(receipt, project_root)   # k3:receipt names a project file
    config: tiny_moe.stack_overrides(named, revision, lock)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

REPO = "k3infra-e2e/tiny-moe"       # the loopback Hub's repo name for it
PRODUCT_LABEL = "k3infra-e2e-cpu"    # the template's hardware.gpu_product_label
SERVED_NAME = "tiny-moe"
TEMPLATE = Path(__file__).resolve().parent / "receipts" / "tiny-moe-cpu.template.yaml"
SHARDS = 2
VOCAB = 4096
# Mixtral's layout at toy scale: 4 layers, hidden 256, 8 experts, top-2, GQA 4/2 heads
# of 64 (a head size vLLM's CPU attention supports).
ARCH = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=4096,
            rope_theta=1e6, rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, the form lm-eval's and vLLM's chat paths expect a template to produce.
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                 "{{ message['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Standard-library files present in every CPython 3.11+: the tokenizer's training text.
CORPUS = ["argparse.py", "textwrap.py", "json/decoder.py", "json/encoder.py", "difflib.py",
          "string.py", "shlex.py", "csv.py", "fractions.py", "this.py"]


def corpus_files() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [stdlib / name for name in CORPUS if (stdlib / name).is_file()]


def train_tokenizer(vocab: int = VOCAB):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    files = corpus_files()
    if not files:
        raise SystemExit(f"tiny_moe: none of {CORPUS} under {sysconfig.get_paths()['stdlib']}")
    tok.train([str(f) for f in files], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL[0],
                                   eos_token=SPECIAL[2], pad_token=SPECIAL[0],
                                   unk_token=None, model_max_length=ARCH["max_position_embeddings"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def generate(out_dir, seed: int = 0, shards: int = SHARDS) -> Path:
    """Write the model repo into out_dir (created; existing files replaced). Returns it."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    tokenizer.save_pretrained(out)
    # transformers 5 writes the template to chat_template.jinja and names its own
    # "TokenizersBackend" class; a transformers 4 reader (an lm-eval image, say) needs the
    # class both know and the template inside tokenizer_config.json. Both forms, one text.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE)
    tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")
    (out / "special_tokens_map.json").unlink(missing_ok=True)   # transformers 4 only: a duplicate

    config = MixtralConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                           eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, dtype="bfloat16", **ARCH)
    config.architectures = ["MixtralForCausalLM"]
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = MixtralForCausalLM(config).to(torch.bfloat16)
    # Shard at just over 1/shards of the weights so the tree has exactly `shards` files.
    total = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    model.save_pretrained(out, safe_serialization=True,
                          max_shard_size=total // shards + (1 << 20))
    index = out / "model.safetensors.index.json"
    if not index.is_file():
        raise SystemExit(f"tiny_moe: {out}: save_pretrained wrote one file, not {shards} shards")
    for f in out.iterdir():
        f.chmod(0o644)        # safetensors writes 0600; a tree others (pods, a Hub) read
    return out


def describe(out_dir) -> dict:
    """What the receipt says about the model that the lock does not: from config.json
    and the shard index, the parameter counts computed from Mixtral's layout."""
    out = Path(out_dir)
    c = json.loads((out / "config.json").read_text())
    index = json.loads((out / "model.safetensors.index.json").read_text())
    h, layers, experts, top_k = (c["hidden_size"], c["num_hidden_layers"],
                                 c["num_local_experts"], c["num_experts_per_tok"])
    head_dim = c.get("head_dim") or h // c["num_attention_heads"]
    attn = h * head_dim * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    expert = 3 * h * c["intermediate_size"]
    dense = layers * (attn + h * experts + 2 * h) + h + 2 * c["vocab_size"] * h
    return {"shards": len(set(index["weight_map"].values())),
            "total_params": dense + layers * experts * expert,
            "active_params": dense + layers * top_k * expert,
            "routed_experts": experts, "active_experts": top_k, "moe_layers": layers,
            "max_context": c["max_position_embeddings"]}


def lock(model_dir, revision: str, out: Path, repo: str = REPO) -> dict:
    """`k3infra weights lock` of the tree, exactly as a user runs it; the lock's JSON."""
    # The console script beside this interpreter (it imports k3infra from sys.path).
    cmd = [str(Path(sys.executable).with_name("k3infra")), "weights", "lock", str(model_dir),
           "--repo", repo, "--revision", revision, "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr.strip()}")
    return json.loads(Path(out).read_text())


def write_receipt(model_dir, revision: str, out_dir, repo: str = REPO,
                  template: Path = TEMPLATE) -> tuple[Path, Path]:
    """The test receipt for a generated tree: TEMPLATE plus what the tree's lock and
    config say (digest, size, shards, parameters, residency). Returns (receipt, lock),
    both in out_dir; the receipt is validated by k3infra.receipt before it is returned."""
    import yaml

    from k3infra.receipt import load_receipt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lock_path = out / "tiny-moe.lock.json"
    facts = lock(model_dir, revision, lock_path, repo)
    model = describe(model_dir)
    data = yaml.safe_load(Path(template).read_text())
    data["model"].update({
        "repo": repo, "revision": facts["revision"], "tree_digest": facts["tree_digest"],
        "tree_digest_algorithm": facts["algorithm"], "shards": model["shards"],
        "size_gb": facts["total_bytes"] / 1e9,
        "total_params": f"{model['total_params'] / 1e6:.1f}M",
        "active_params_per_token": f"{model['active_params'] / 1e6:.1f}M",
        "routed_experts": model["routed_experts"], "active_experts": model["active_experts"],
        "moe_layers": model["moe_layers"], "max_context": str(model["max_context"])})
    # TP1: the one engine holds every weight (the HBM check reads this against gpus:).
    data["residency"]["weights_gib_per_gpu"] = round(facts["total_bytes"] / 2**30, 6)
    receipt = out / f"{data['id']}.yaml"
    receipt.write_text(f"# Written by tests/e2e/tiny_moe.py from {Path(template).name} and "
                       f"{lock_path.name} (k3infra weights lock): do not edit.\n"
                       + yaml.safe_dump(data, sort_keys=False, width=100))
    load_receipt(str(receipt))           # a malformed result fails here, naming the file
    return receipt, lock_path


# Where a test puts a receipt inside a project (git-ignored: build/ is), as k3:receipt
# names a file of the Pulumi project, never one outside it.
PROJECT_RECEIPTS = Path("build") / "test-receipts"


def in_project(receipt_path, root) -> str:
    """A copy of the receipt inside the project at `root`, under a name no other test
    run uses; its project-relative path, the value k3:receipt takes."""
    rel = PROJECT_RECEIPTS / f"{uuid.uuid4().hex[:8]}-{Path(receipt_path).name}"
    (Path(root) / rel).parent.mkdir(parents=True, exist_ok=True)
    (Path(root) / rel).write_bytes(Path(receipt_path).read_bytes())
    return rel.as_posix()


def variant(receipt_path, out: Path, *, id: str, **changes) -> Path:
    """A receipt derived from another one, written to `out` and validated: `env` adds
    engine variables, `figures` replaces the measured e2el figures ([] with
    status=candidate: nothing measured), any other key replaces a top-level field."""
    import yaml

    from k3infra.receipt import load_receipt

    data = yaml.safe_load(Path(receipt_path).read_text())
    data["id"] = id
    for name, value in changes.pop("env", {}).items():
        data["serve"]["engine_env"].append(
            {"name": name, "value": value, "why": "a variable the engine ignores: this receipt "
             "differs from the one it was derived from in its engine env (tests/e2e)"})
    if "figures" in changes:
        data["measured"] = [{"concurrency": c, "metric": "e2el", "p50_ms": p50, "p99_ms": p99}
                            for c, p50, p99 in changes.pop("figures")]
    data.update(changes)
    out.write_text(f"# Derived by tests/e2e/tiny_moe.py from {Path(receipt_path).name}: do not "
                   "edit.\n" + yaml.safe_dump(data, sort_keys=False, width=100))
    load_receipt(str(out))
    return out


def as_candidate(receipt_path, out: Path) -> Path:
    """The same receipt as a candidate: its placeholder figures dropped, nothing measured."""
    return variant(receipt_path, out, id=f"{Path(receipt_path).stem}-candidate",
                   status="candidate", measured_on=None, figures=[], evidence=[],
                   source=f"tests/e2e/receipts/{TEMPLATE.name} and the tree's weights lock")


def stack_overrides(receipt_name: str, revision: str, lock_path) -> list[str]:
    """The `k3:*` keys (render --config form) that point a stack at this model: the test
    receipt (k3:receipt: a project file, in_project), its GPU label, the revision and the
    lock."""
    return [f"receipt={receipt_name}", f"gpuProduct={PRODUCT_LABEL}", f"weightsRevision={revision}",
            f"weights.lockFile={lock_path}", f"servedModelName={SERVED_NAME}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.tiny_moe",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write the model repo (vLLM CPU venv)")
    gen.add_argument("out", type=Path)
    gen.add_argument("--seed", type=int, default=0)
    rec = sub.add_parser("receipt", help="write its receipt and lock (project venv)")
    rec.add_argument("model_dir", type=Path)
    rec.add_argument("--revision", required=True, help="the 40-hex commit the Hub serves it at")
    rec.add_argument("--repo", default=REPO)
    rec.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "generate":
        out = generate(args.out, args.seed)
        size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
        print(f"generated {out}: {describe(out)}, {size} bytes")
    else:
        receipt, lock_path = write_receipt(args.model_dir, args.revision, args.out, args.repo)
        print(f"wrote {receipt} and {lock_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
