package main

import (
	"example.com/pulumi-k3infra/sdk/go/k3infra"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi/config"
)

func main() {
	pulumi.Run(func(ctx *pulumi.Context) error {
		cfg := config.New(ctx, "")
		k3, err := k3infra.NewK3ServingStack(ctx, "kimi", &k3infra.K3ServingStackArgs{
			WeightsRevision: pulumi.String("3f1c2b4a5d6e7f8091a2b3c4d5e6f708192a3b4c"),
			ApiKey:          cfg.RequireSecret("apiKey"),
			EngineImage:     pulumi.String("registry.example.com/k3/vllm-k3@sha256:5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e"),
			Serving: &k3infra.ServingArgs{
				ProxyImage: pulumi.StringRef("nginxinc/nginx-unprivileged:1.28.0-alpine-slim@sha256:7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a"),
			},
			AcceptModelLicense: pulumi.BoolRef(true),
			Namespace:          pulumi.StringRef("inference"),
			CreateNamespace:    pulumi.BoolRef(true),
		})
		if err != nil {
			return err
		}
		ctx.Export("endpoint", k3.Endpoint)
		return nil
	})
}
