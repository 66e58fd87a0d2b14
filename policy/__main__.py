"""k3infra's CrossGuard policy pack: `pulumi preview --policy-pack policy/`.

Thin on purpose: the policies are importable objects in `k3infra.policies`, tested
there and run offline by `k3infra policy check`. The Pulumi CLI runs this file as a
program (`python -m pulumi.policy <engine> policy/`, which uses runpy with run_name
"__main__"), and constructing the PolicyPack starts the analyzer's gRPC server and
blocks; importing this file under any other name starts nothing.
"""
from k3infra.receipt import ReceiptError

try:
    from k3infra.policies import serve_pack   # the policies read the chosen receipt
except ReceiptError as exc:     # K3INFRA_RECEIPT names a bad file: one line, no traceback
    raise SystemExit(f"k3infra policy pack: {exc}")

if __name__ == "__main__":
    serve_pack()
