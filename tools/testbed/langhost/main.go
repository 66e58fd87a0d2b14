// Command pulumi-language-python is k3infra's own Python language host for the Pulumi engine.
//
// Why it exists: Pulumi's pulumi-language-python is a separate Go module
// (github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3) that the Go module
// proxy reachable from k3infra's build machines does not serve (403 for every version,
// pseudo-version and commit tried; see docs/engine-e2e.md). Everything it needs to run a
// Python program is in the Pulumi SDK module (sdk/v3), which is served: the Python
// toolchain resolver, the policy-pack proxy, the gRPC service definitions and the
// `pulumi-language-python-exec` entry script. This host wires those together.
//
// It implements the LanguageRuntime calls that `pulumi preview/up/refresh/destroy` and a
// Python policy pack (`--policy-pack`) use: Handshake, GetPluginInfo, GetRequiredPlugins,
// GetRequiredPackages, Run, RunPlugin (policy packs and plugins), InstallDependencies
// (the SDK's toolchain: virtualenv + requirements.txt), About,
// GetProgramDependencies and Cancel. Code generation, packing, linking and debugging are
// not implemented and answer Unimplemented.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	sdk "github.com/pulumi/pulumi/sdk/v3"
	"github.com/pulumi/pulumi/sdk/v3/go/common/apitype"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/version"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"github.com/pulumi/pulumi/sdk/v3/python/toolchain"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// execScript is the SDK's entry script; it must sit beside this binary.
const execScript = "pulumi-language-python-exec"

// exitAfterUserMessage is the Python SDK's exit code for "error already shown to the user".
const exitAfterUserMessage = 32

func main() {
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.String("tracing", "", "accepted for compatibility; tracing is not supported")
	// Hosts built on an older SDK (pulumi-yaml v1.25.0's schema loader, sdk v3.206.0)
	// start a language plugin with its runtime options as flags and -root; Pulumi's own
	// host accepts them. They are the defaults for a request whose ProgramInfo omits them.
	flags := map[string]*string{}
	for _, name := range []string{"virtualenv", "toolchain", "typechecker"} {
		flags[name] = flag.String(name, "", "runtime option "+name+" (older engines pass options as flags)")
	}
	root := flag.String("root", "", "the program's root directory (older engines)")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Version)
		return
	}

	self, err := os.Executable()
	if err != nil {
		fail(fmt.Errorf("cannot locate this executable: %w", err))
	}
	script := filepath.Join(filepath.Dir(self), execScript)
	if _, err := os.Stat(script); err != nil {
		fail(fmt.Errorf("missing %s beside the language host: %w", execScript, err))
	}

	host := &languageHost{script: script, root: *root, flagOptions: map[string]any{}}
	for name, value := range flags {
		if *value != "" {
			host.flagOptions[name] = *value
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cancel := make(chan bool)
	go func() { <-ctx.Done(); close(cancel) }()

	if args := flag.Args(); len(args) > 0 {
		host.engine = args[0]
		if err := rpcutil.Healthcheck(ctx, host.engine, 5*time.Minute, stop); err != nil {
			fail(fmt.Errorf("engine health check: %w", err))
		}
	}

	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Cancel: cancel,
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, host)
			return nil
		},
	})
	if err != nil {
		fail(fmt.Errorf("cannot serve: %w", err))
	}
	// The engine reads the port from the first line of stdout.
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "pulumi-language-python (k3infra): %v\n", err)
	os.Exit(1)
}

type languageHost struct {
	pulumirpc.UnimplementedLanguageRuntimeServer
	script      string
	engine      string
	root        string         // -root, from an engine that passes it as a flag
	flagOptions map[string]any // runtime options passed as flags
}

// options reads Pulumi.yaml's runtime options (virtualenv, toolchain) the way the SDK's
// toolchain resolver expects them.
func (h *languageHost) options(info *pulumirpc.ProgramInfo, isPlugin bool) (toolchain.PythonOptions, error) {
	opts := toolchain.PythonOptions{Root: info.GetRootDirectory(), ProgramDir: info.GetProgramDirectory()}
	if opts.Root == "" {
		opts.Root = h.root
	}
	raw := map[string]any{}
	for k, v := range h.flagOptions {
		raw[k] = v
	}
	if info.GetOptions() != nil {
		for k, v := range info.GetOptions().AsMap() {
			raw[k] = v
		}
	}
	if v, ok := raw["virtualenv"]; ok {
		s, ok := v.(string)
		if !ok {
			return opts, errors.New("runtime option virtualenv must be a string")
		}
		opts.Virtualenv = s
	}
	switch raw["toolchain"] {
	case nil, "pip":
		opts.Toolchain = toolchain.Pip
	case "uv":
		opts.Toolchain = toolchain.Uv
	case "poetry":
		opts.Toolchain = toolchain.Poetry
	default:
		return opts, fmt.Errorf("runtime option toolchain %v: accepted are pip, uv, poetry", raw["toolchain"])
	}
	if _, ok := raw["typechecker"]; ok {
		return opts, errors.New("runtime option typechecker is not supported by k3infra's language host")
	}
	// Plugins (not policy packs) default to a `venv` folder, as Pulumi's own host does.
	if isPlugin && opts.Virtualenv == "" {
		opts.Virtualenv = "venv"
	}
	return opts, nil
}

func (h *languageHost) Handshake(
	ctx context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	h.engine = req.GetEngineAddress()
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *languageHost) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version.Version}, nil
}

// Plugins are installed explicitly (`make testbed` installs the Kubernetes provider with
// `pulumi plugin install --file`), so the host reports none: the engine then loads each
// provider on first use at the version the SDK asks for, and fails if it is missing.
func (h *languageHost) GetRequiredPlugins(
	context.Context, *pulumirpc.GetRequiredPluginsRequest,
) (*pulumirpc.GetRequiredPluginsResponse, error) {
	return &pulumirpc.GetRequiredPluginsResponse{}, nil
}

func (h *languageHost) GetRequiredPackages(
	context.Context, *pulumirpc.GetRequiredPackagesRequest,
) (*pulumirpc.GetRequiredPackagesResponse, error) {
	return &pulumirpc.GetRequiredPackagesResponse{}, nil
}

func (h *languageHost) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	if h.engine == "" {
		return nil, errors.New("Run before Handshake: no engine address")
	}
	opts, err := h.options(req.GetInfo(), false)
	if err != nil {
		return nil, err
	}
	tc, err := toolchain.ResolveToolchain(opts)
	if err != nil {
		return nil, err
	}
	if err := tc.ValidateVenv(ctx); err != nil {
		return nil, err
	}

	args := []string{h.script}
	flagArg := func(k, v string) {
		if v != "" {
			args = append(args, "--"+k, v)
		}
	}
	flagArg("monitor", req.GetMonitorAddress())
	flagArg("engine", h.engine)
	flagArg("project", req.GetProject())
	flagArg("root_directory", req.GetInfo().GetRootDirectory())
	flagArg("stack", req.GetStack())
	flagArg("pwd", req.GetPwd())
	flagArg("dry_run", strconv.FormatBool(req.GetDryRun()))
	flagArg("parallel", strconv.Itoa(int(req.GetParallel())))
	flagArg("organization", req.GetOrganization())
	args = append(args, req.GetInfo().GetEntryPoint())
	args = append(args, req.GetArgs()...)

	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	// The SDK reads config and the names of secret keys from these two variables.
	// A stack with no config sends none: the SDK expects an object, never `null`.
	configMap := req.GetConfig()
	if configMap == nil {
		configMap = map[string]string{}
	}
	config, err := json.Marshal(configMap)
	if err != nil {
		return nil, err
	}
	secretKeys := req.GetConfigSecretKeys()
	if secretKeys == nil {
		secretKeys = []string{}
	}
	secretJSON, err := json.Marshal(secretKeys)
	if err != nil {
		return nil, err
	}
	cmd.Env = append(cmd.Env, "PULUMI_CONFIG="+string(config), "PULUMI_CONFIG_SECRET_KEYS="+string(secretJSON))
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second

	if err := cmd.Run(); err != nil {
		_ = os.Stdout.Sync()
		_ = os.Stderr.Sync()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			if status, ok := exitErr.Sys().(syscall.WaitStatus); ok && status.ExitStatus() == exitAfterUserMessage {
				return &pulumirpc.RunResponse{Bail: true}, nil
			}
			return &pulumirpc.RunResponse{Error: fmt.Sprintf("program exited with non-zero exit code: %d", exitErr.ExitCode())}, nil
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("could not run the Python program: %v", err)}, nil
	}
	return &pulumirpc.RunResponse{}, nil
}

// RunPlugin runs a Python policy pack (`python -u -m pulumi.policy ARGS... DIR`, in the
// pack's folder, with the stack's configuration in its environment) or a plugin's
// `__main__.py`.
func (h *languageHost) RunPlugin(req *pulumirpc.RunPluginRequest, server pulumirpc.LanguageRuntime_RunPluginServer) error {
	ctx := server.Context()
	isPolicy := req.GetKind() == string(apitype.AnalyzerPlugin)
	opts, err := h.options(req.GetInfo(), !isPolicy)
	if err != nil {
		return err
	}
	tc, err := toolchain.ResolveToolchain(opts)
	if err != nil {
		return err
	}
	var args []string
	if isPolicy {
		args = append([]string{"-u", "-m", "pulumi.policy"}, req.GetArgs()...)
		args = append(args, req.GetInfo().GetProgramDirectory())
	} else {
		args = append([]string{req.GetInfo().GetProgramDirectory()}, req.GetArgs()...)
	}
	cmd, err := tc.Command(ctx, args...)
	if err != nil {
		return err
	}
	closer, stdout, stderr, err := rpcutil.MakeRunPluginStreams(server, false)
	if err != nil {
		return err
	}
	defer closer.Close()
	cmd.Dir = req.GetPwd()
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}

	var proxy *sdk.PolicyProxy
	if isPolicy {
		// The engine configures the analyzer before it starts; the SDK's proxy answers that
		// call, hands us the stack's configuration, then forwards to the real pack.
		cmd.Dir = req.GetInfo().GetProgramDirectory()
		proxy, stdout, err = sdk.NewPolicyProxy(ctx, stdout)
		if err != nil {
			return fmt.Errorf("policy pack proxy: %w", err)
		}
		stack, err := proxy.AwaitConfiguration(ctx)
		if err != nil {
			return fmt.Errorf("policy pack configuration: %w", err)
		}
		if stack != nil {
			setEnv := func(k, v string) {
				if v != "" {
					cmd.Env = append(cmd.Env, k+"="+v)
				}
			}
			setEnv("PULUMI_ORGANIZATION", stack.GetOrganization())
			setEnv("PULUMI_PROJECT", stack.GetProject())
			setEnv("PULUMI_STACK", stack.GetStack())
			setEnv("PULUMI_DRY_RUN", strconv.FormatBool(stack.GetDryRun()))
			if stack.GetConfig() != nil {
				b, err := json.Marshal(stack.GetConfig())
				if err != nil {
					return err
				}
				setEnv("PULUMI_CONFIG", string(b))
			}
		}
	}
	cmd.Env = append(cmd.Env, req.GetEnv()...)
	cmd.Stdout, cmd.Stderr = stdout, stderr

	if err := cmd.Start(); err != nil {
		return fmt.Errorf("could not start the plugin: %w", err)
	}
	if proxy != nil {
		if err := proxy.Attach(ctx, cmd); err != nil {
			return fmt.Errorf("policy pack proxy attach: %w", err)
		}
		return closer.Close()
	}
	if err := cmd.Wait(); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return server.Send(&pulumirpc.RunPluginResponse{
				Output: &pulumirpc.RunPluginResponse_Exitcode{Exitcode: int32(exitErr.ExitCode())},
			})
		}
		return err
	}
	return closer.Close()
}

// InstallDependencies creates the virtualenv the project names and installs its
// requirements.txt with the SDK's own toolchain code (`pulumi install`).
func (h *languageHost) InstallDependencies(
	req *pulumirpc.InstallDependenciesRequest, server pulumirpc.LanguageRuntime_InstallDependenciesServer,
) error {
	opts, err := h.options(req.GetInfo(), req.GetIsPlugin())
	if err != nil {
		return err
	}
	tc, err := toolchain.ResolveToolchain(opts)
	if err != nil {
		return err
	}
	closer, stdout, stderr, err := rpcutil.MakeInstallDependenciesStreams(server, req.GetIsTerminal())
	if err != nil {
		return err
	}
	defer closer.Close()
	if err := tc.InstallDependencies(server.Context(), req.GetInfo().GetProgramDirectory(),
		req.GetUseLanguageVersionTools(), true, stdout, stderr); err != nil {
		return err
	}
	return closer.Close()
}

func (h *languageHost) About(ctx context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	opts, err := h.options(req.GetInfo(), false)
	if err != nil {
		return nil, err
	}
	tc, err := toolchain.ResolveToolchain(opts)
	if err != nil {
		return nil, err
	}
	info, err := tc.About(ctx)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.AboutResponse{
		Executable: info.PythonExecutable,
		Version:    info.PythonVersion.String(),
		Metadata:   map[string]string{"host": "k3infra"},
	}, nil
}

func (h *languageHost) GetProgramDependencies(
	ctx context.Context, req *pulumirpc.GetProgramDependenciesRequest,
) (*pulumirpc.GetProgramDependenciesResponse, error) {
	opts, err := h.options(req.GetInfo(), false)
	if err != nil {
		return nil, err
	}
	tc, err := toolchain.ResolveToolchain(opts)
	if err != nil {
		return nil, err
	}
	pkgs, err := tc.ListPackages(ctx, req.GetTransitiveDependencies())
	if err != nil {
		return nil, err
	}
	resp := &pulumirpc.GetProgramDependenciesResponse{}
	for _, p := range pkgs {
		resp.Dependencies = append(resp.Dependencies, &pulumirpc.DependencyInfo{Name: p.Name, Version: p.Version})
	}
	return resp, nil
}

func (h *languageHost) Cancel(context.Context, *emptypb.Empty) (*emptypb.Empty, error) {
	return &emptypb.Empty{}, nil
}
