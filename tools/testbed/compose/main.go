// compose-config: load a Compose file with compose-go (the loader Docker Compose v2 uses)
// and print the normalised model, like `docker compose config`. It fails, naming the
// problem, when the file breaks the Compose schema or its references (an unknown service
// in depends_on, an interpolated variable that is required and unset, ...).
//
//	compose-config [-env-file FILE] [-no-interpolate] COMPOSE.yaml
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	envFile := flag.String("env-file", "", "an env file for interpolation (docker compose --env-file)")
	noInterp := flag.Bool("no-interpolate", false, "leave ${VAR} references as written")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: compose-config [-env-file FILE] [-no-interpolate] COMPOSE.yaml")
		os.Exit(2)
	}
	// The project name is the file's own `name:` (as `docker compose config` reads it).
	opts := []cli.ProjectOptionsFn{cli.WithOsEnv}
	if *envFile != "" {
		opts = append(opts, cli.WithEnvFiles(*envFile))
	}
	opts = append(opts, cli.WithDotEnv)
	if *noInterp {
		opts = append(opts, cli.WithInterpolation(false))
	}
	po, err := cli.NewProjectOptions([]string{flag.Arg(0)}, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "compose-config:", err)
		os.Exit(1)
	}
	project, err := po.LoadProject(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "compose-config:", err)
		os.Exit(1)
	}
	out, err := project.MarshalYAML()
	if err != nil {
		fmt.Fprintln(os.Stderr, "compose-config:", err)
		os.Exit(1)
	}
	os.Stdout.Write(out)
}
