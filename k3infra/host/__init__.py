"""One 8-GPU Docker host without Kubernetes: the host plan (plan.py), its Pulumi
component on pulumi-docker (component.py), the equivalent compose.yaml (compose.py) and
the host preflight (preflight.py). docs/host.md."""
