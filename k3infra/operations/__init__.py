"""Operating the serving stack: NetworkPolicies (network.py), Prometheus Operator objects
(monitoring.py), the Grafana dashboard (dashboard.py), the metric names they rely on
(metric_names.py + metric_names.yaml) and the `ServingOperations` component
(component.py). docs/operations.md describes them and the safe rollout procedure."""
