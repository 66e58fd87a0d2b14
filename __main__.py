"""The stack program: read the `k3:*` config, validate it, build K3ServingStack.

`pulumi up` runs this file; `k3infra render` runs the same file under the SDK's mocks
and says so through the `__k3infra_render_mode__` global of this run (never through the
environment, which a later `pulumi up` could inherit).
"""
from k3infra.program import run

run(offline_render=globals().get("__k3infra_render_mode__") == "offline")
