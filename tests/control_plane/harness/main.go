// Command control-plane-harness runs a real kube-apiserver and etcd the way Kubeflow Trainer's, JobSet's and
// Kueue's integration tests do: controller-runtime's envtest (pkg/envtest) on the binaries built from
// k8s.io/kubernetes and go.etcd.io/etcd at the versions in go.mod, with the CRDs we vendor installed.
//
// It writes a kubeconfig for a system:masters user, prints one JSON line {"kubeconfig": ..., "host": ...} on
// stdout when the API server answers and the CRDs are established, and serves until stdin closes or it gets
// SIGINT/SIGTERM; then it stops both processes.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	var crds stringList
	assets := flag.String("assets", "", "folder holding the kube-apiserver and etcd binaries")
	kubeconfig := flag.String("write-kubeconfig", "", "where to write the kubeconfig")
	// the plugins GKE adds to kube-apiserver's default set (ADMISSION_PLUGINS in tests/control_plane/__init__.py
	// says which and where GKE documents them); the default set stays on
	admission := flag.String("enable-admission-plugins", "", "kube-apiserver --enable-admission-plugins")
	trainerDir := flag.String("trainer", "", "Kubeflow Trainer's module folder: run its controllers and webhooks and JobSet's controllers")
	jobsetDir := flag.String("jobset", "", "JobSet's module folder: with --trainer, also run JobSet's webhooks")
	verbose := flag.Bool("v", false, "the controllers' debug logs on stderr")
	flag.Var(&crds, "crds", "a folder or file of CustomResourceDefinitions to install (repeatable)")
	flag.Parse()
	if *assets == "" || *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "usage: control-plane-harness --assets DIR --write-kubeconfig FILE [--crds PATH]...")
		os.Exit(2)
	}

	env := &envtest.Environment{
		BinaryAssetsDirectory: *assets,
		CRDDirectoryPaths:     crds,
		ErrorIfCRDPathMissing: true,
	}
	if *trainerDir != "" {
		withTrainer(env, *trainerDir)
		if *jobsetDir != "" {
			if err := withJobSetWebhooks(env, *jobsetDir); err != nil {
				fmt.Fprintln(os.Stderr, "JobSet's webhooks:", err)
				os.Exit(1)
			}
		}
	}
	api := env.ControlPlane.GetAPIServer()
	args := api.Configure()
	// envtest's defaults already bind to 127.0.0.1 on a free port and turn the RBAC authorizer on
	// (--authorization-mode=RBAC, controller-runtime pkg/internal/testing/controlplane/apiserver.go); set it
	// again so that a change of default cannot turn it off unnoticed.
	args.Set("authorization-mode", "RBAC")
	if *admission != "" {
		args.Set("enable-admission-plugins", *admission)
	}

	if _, err := env.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "starting the control plane:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	code := 0
	if *trainerDir != "" {
		if err := runControllers(ctx, env, *verbose, *jobsetDir != ""); err != nil {
			fmt.Fprintln(os.Stderr, "starting the controllers:", err)
			code = 1
		}
	}
	if code == 0 {
		code = serve(env, *kubeconfig)
	}
	cancel()
	if err := env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the control plane:", err)
		code = 1
	}
	os.Exit(code)
}

func serve(env *envtest.Environment, path string) int {
	admin, err := env.ControlPlane.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "adding the admin user:", err)
		return 1
	}
	config, err := admin.KubeConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "writing the kubeconfig:", err)
		return 1
	}
	if err := os.WriteFile(path, config, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ready, _ := json.Marshal(map[string]string{"kubeconfig": path, "host": env.Config.Host})
	fmt.Println(string(ready))

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	closed := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(closed) }()
	select {
	case <-stop:
	case <-closed:
	}
	return 0
}
