"""Names of the gateway's objects, derived from the instance (k3infra.naming's rule:
`<instance>` or `<instance>-<suffix>`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GatewayNames:
    base: str
    namespace: str

    @property
    def gateway(self) -> str:
        return self.base

    @property
    def route(self) -> str:
        return self.base

    @property
    def pool(self) -> str:
        return self.base

    @property
    def picker(self) -> str:
        """The endpoint picker's Deployment, Service, ServiceAccount, Role, ConfigMap."""
        return f"{self.base}-epp"

    @property
    def key_policy(self) -> str:
        return f"{self.base}-gateway-key"

    @property
    def keys_secret(self) -> str:
        return f"{self.base}-gateway-keys"

    @property
    def picker_policy(self) -> str:
        return f"{self.base}-epp"
