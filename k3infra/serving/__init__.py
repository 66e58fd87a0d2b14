"""The vLLM serving layer: pure manifest builders (manifests.py), the startup budget
(startup.py) and the thin Pulumi component (component.py)."""
