// sdkgen: Pulumi's own SDK generators (pkg/v3/codegen/go and codegen/nodejs, the code
// `pulumi package add` runs inside the Go and Node.js language hosts) over a schema file.
//
//	sdkgen -language go|nodejs -out DIR SCHEMA.json
//
// The Go and Node.js language hosts themselves are not built here (the Go module proxy
// refuses their modules, docs/e2e.md), so the e2e tests generate the SDKs with this and
// compile the consumer programs against them; they do not run them.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/blang/semver"
	gogen "github.com/pulumi/pulumi/pkg/v3/codegen/go"
	"github.com/pulumi/pulumi/pkg/v3/codegen/nodejs"
	"github.com/pulumi/pulumi/pkg/v3/codegen/schema"
)

// noDependencies loads no other package: the schema must stand alone (k3infra's does).
type noDependencies struct{}

func (noDependencies) LoadPackage(name string, _ *semver.Version) (*schema.Package, error) {
	return nil, fmt.Errorf("the schema references package %q: sdkgen loads no other package", name)
}

func (l noDependencies) LoadPackageV2(_ context.Context, d *schema.PackageDescriptor) (*schema.Package, error) {
	return l.LoadPackage(d.Name, nil)
}

func (l noDependencies) LoadPackageReference(name string, v *semver.Version) (schema.PackageReference, error) {
	return nil, fmt.Errorf("the schema references package %q: sdkgen loads no other package", name)
}

func (l noDependencies) LoadPackageReferenceV2(
	_ context.Context, d *schema.PackageDescriptor,
) (schema.PackageReference, error) {
	return l.LoadPackageReference(d.Name, nil)
}

func main() {
	language := flag.String("language", "", "go or nodejs")
	out := flag.String("out", "", "directory to write the SDK into")
	flag.Parse()
	if flag.NArg() != 1 || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: sdkgen -language go|nodejs -out DIR SCHEMA.json")
		os.Exit(2)
	}
	if err := run(*language, *out, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "sdkgen:", err)
		os.Exit(1)
	}
}

func run(language, out, schemaPath string) error {
	data, err := os.ReadFile(schemaPath)
	if err != nil {
		return err
	}
	var spec schema.PackageSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return err
	}
	pkg, diags, err := schema.BindSpec(spec, noDependencies{}, schema.ValidationOptions{})
	if err != nil {
		return err
	}
	if diags.HasErrors() {
		return diags
	}
	// As `pulumi package add` does for a local package.
	pkg.SupportPack = true
	var files map[string][]byte
	switch language {
	case "go":
		files, err = gogen.GeneratePackage("pulumi", pkg, nil)
	case "nodejs":
		files, err = nodejs.GeneratePackage("pulumi", pkg, nil, nil, true, noDependencies{})
	default:
		return fmt.Errorf("language %q: go or nodejs", language)
	}
	if err != nil {
		return err
	}
	for name, content := range files {
		path := filepath.Join(out, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, content, 0o644); err != nil {
			return err
		}
	}
	return nil
}
