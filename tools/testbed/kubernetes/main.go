// Command pulumi-resource-kubernetes serves the Kubernetes provider library
// pinned in go.mod.
//
// Upstream's own main package embeds schema-embed.json and
// terraform-mapping-embed.json, generated files that the module zip does not
// carry, so it cannot be built from the module cache. This one embeds the same
// two files, which build.sh generates (with ./embedgen) from the pinned
// module's schema.json and terraform-mapping.json into a staging copy of this
// folder; they are never committed. Build it with build.sh, not `go build .`.
package main

import (
	_ "embed"

	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
)

//go:embed schema-embed.json
var pulumiSchema []byte

//go:embed terraform-mapping-embed.json
var terraformMapping []byte

func main() {
	// version.Version is set at link time (-X); the schema carries the same value.
	provider.Serve("kubernetes", version.Version, pulumiSchema, terraformMapping)
}
