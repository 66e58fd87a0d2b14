"""Re-measuring the receipt: Workload A, the benchmark Job, comparison with the receipt,
a new receipt from the user's own results, and drift checks for `k3infra verify`.

Modules that run inside the benchmark pod (`workload`, `pod_runner`) use the standard
library only (plus the tokenizer the engine image ships); the rest are pure functions
the CLI and the `Benchmark` component call. Nothing is imported here, so `k3infra bench`
stays light.
"""
