"""The stack program: read the `k3:*` config, validate it, build K3ServingStack.

`pulumi up` runs this file; `k3infra render` runs the same file under the SDK's mocks.
"""
from k3infra.program import run

run()
