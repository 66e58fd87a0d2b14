"""The running deployment: read it from the cluster (`cluster`, the kubernetes client,
extra `cluster`) and compare it with the receipt (`drift`, pure). Used by
`k3infra verify`; the benchmark's result fetch builds on the same reader."""
