"""k3infra as a Pulumi package for every language (docs/component.md#other-languages).

`provider/` (PulumiPlugin.yaml, runtime python) runs `k3infra.plugin.host.main`: Pulumi's
component provider host serves `K3ServingStack` with a schema inferred from typed args.

Modules: `shapes` (the typed args, derived from the config models), `schema` (what the
inference cannot say: descriptions, defaults, secrets, the package version),
`component` (the component the provider constructs), `host` (the entry point).
"""
