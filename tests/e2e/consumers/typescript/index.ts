import * as pulumi from "@pulumi/pulumi";
import * as k3infra from "@pulumi/k3infra";

const cfg = new pulumi.Config();
const k3 = new k3infra.K3ServingStack("kimi", {
    weightsRevision: "3f1c2b4a5d6e7f8091a2b3c4d5e6f708192a3b4c",
    apiKey: cfg.requireSecret("apiKey"),
    engineImage: "registry.example.com/k3/vllm-k3@sha256:5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e",
    serving: {
        proxyImage: "nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a",
    },
    acceptModelLicense: true,
    namespace: "inference",
    createNamespace: true,
});
export const endpoint = k3.endpoint;
