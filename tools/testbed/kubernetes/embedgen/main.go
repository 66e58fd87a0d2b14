// Command embedgen writes the two files main.go embeds, from the pinned
// provider module's checked-in sources: the package schema with its "version"
// set to the version linked into the binary, and the Terraform mapping, both
// as compact JSON. It does what upstream's cmd/pulumi-resource-kubernetes/generate.go
// does, with the standard library only, and keeps every schema field as it is.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	moduleDir := flag.String("module", "", "directory of github.com/pulumi/pulumi-kubernetes/provider/v4 in the module cache")
	version := flag.String("version", "", "provider version written into the schema (the one linked into the binary)")
	outDir := flag.String("out", "", "directory that receives schema-embed.json and terraform-mapping-embed.json")
	flag.Parse()
	if *moduleDir == "" || *version == "" || *outDir == "" {
		fail("-module, -version and -out are all required")
	}
	src := filepath.Join(*moduleDir, "cmd", "pulumi-resource-kubernetes")

	var schema map[string]json.RawMessage
	read(filepath.Join(src, "schema.json"), &schema)
	if _, ok := schema["resources"]; !ok {
		fail("%s has no \"resources\": not a Pulumi package schema", filepath.Join(src, "schema.json"))
	}
	v, _ := json.Marshal(*version)
	schema["version"] = v
	write(filepath.Join(*outDir, "schema-embed.json"), schema)

	// Compacted as raw JSON: decoding into `any` would turn numbers into floats.
	var mapping json.RawMessage
	read(filepath.Join(src, "terraform-mapping.json"), &mapping)
	write(filepath.Join(*outDir, "terraform-mapping-embed.json"), mapping)
}

func read(path string, into any) {
	data, err := os.ReadFile(path)
	if err != nil {
		fail("%v", err)
	}
	if err := json.Unmarshal(data, into); err != nil {
		fail("%s: %v", path, err)
	}
}

// write marshals compactly (raw JSON included); map keys come out sorted,
// so the same input gives the same bytes.
func write(path string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		fail("%s: %v", path, err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "embedgen: "+format+"\n", args...)
	os.Exit(1)
}
