// Command training-operator-harness runs the Kubeflow Training Operator v1.9.4's PyTorchJob and TFJob controllers
// and their defaulting and validating webhooks against an API server that is already running (the envtest
// control plane of ../harness), set up as the operator's own integration tests set them up
// (pkg/controller.v1/pytorch/pytorchjob_controller_suite_test.go:94-125 and
// pkg/controller.v1/tensorflow/suite_test.go:92-122 at v1.9.4): one controller-runtime manager, no gang
// scheduler, one worker thread, the validating webhooks installed by envtest's WebhookInstallOptions from the
// module's manifests/base/webhook/manifests.yaml with a self-signed certificate on a loopback port. (The operator
// has no mutating webhook: its controllers apply the API's defaults, pkg/apis/kubeflow.org/v1/*_defaults.go.)
//
// It is its own module and binary beside the harness: the operator pins its own scheduler-plugins and Volcano
// APIs, which Kubeflow Trainer v2's (in the harness) are not.
//
// It prints one JSON line {"webhook": "host:port"} on stdout when the webhook server answers, and serves until
// stdin closes or it gets SIGINT/SIGTERM (the API server, and the webhook configuration installed there, stop
// with the harness).
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"github.com/kubeflow/training-operator/pkg/config"
	"github.com/kubeflow/training-operator/pkg/controller.v1/common"
	"github.com/kubeflow/training-operator/pkg/controller.v1/pytorch"
	"github.com/kubeflow/training-operator/pkg/controller.v1/tensorflow"
	pytorchwebhook "github.com/kubeflow/training-operator/pkg/webhooks/pytorch"
	tensorflowwebhook "github.com/kubeflow/training-operator/pkg/webhooks/tensorflow"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"volcano.sh/apis/pkg/apis/scheduling/v1beta1"
)

func main() {
	operatorDir := flag.String("operator", "", "the Training Operator's module folder (its webhook manifests)")
	verbose := flag.Bool("v", false, "the controllers' debug logs on stderr")
	flag.Parse()
	// --kubeconfig is controller-runtime's flag (pkg/client/config), which the operator's main reads too
	// (cmd/training-operator.v1/main.go:138)
	if flag.Lookup("kubeconfig").Value.String() == "" || *operatorDir == "" {
		fmt.Fprintln(os.Stderr, "usage: training-operator-harness --kubeconfig FILE --operator DIR")
		os.Exit(2)
	}
	if err := run(*operatorDir, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(operatorDir string, verbose bool) error {
	ctrl.SetLogger(zap.New(zap.UseDevMode(verbose)))
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("reading the kubeconfig: %w", err)
	}
	// the defaults of the operator's flags (cmd/training-operator.v1/main.go:104-109): the init container that
	// waits for the master's Service on each PyTorchJob worker
	config.Config.PyTorchInitContainerImage = config.PyTorchInitContainerImageDefault
	config.Config.PyTorchInitContainerTemplateFile = config.PyTorchInitContainerTemplateFileDefault
	config.Config.PyTorchInitContainerMaxTries = config.PyTorchInitContainerMaxTriesDefault
	for _, add := range []func(*runtime.Scheme) error{v1beta1.AddToScheme, kubeflowv1.AddToScheme} {
		if err := add(scheme.Scheme); err != nil {
			return err
		}
	}
	hooks := envtest.WebhookInstallOptions{
		Paths: []string{filepath.Join(operatorDir, "manifests", "base", "webhook", "manifests.yaml")},
	}
	if err := hooks.PrepWithoutInstalling(); err != nil {
		return fmt.Errorf("reading the webhooks: %w", err)
	}
	// the name the operator's kustomization gives the configuration (manifests/base/webhook/patch.yaml:16-18,
	// cmd/training-operator.v1/main.go:57): manifests.yaml's own, validating-webhook-configuration, is Trainer's
	// too, whose configuration the harness has installed
	for _, hook := range hooks.ValidatingWebhooks {
		hook.Name = "validator.training-operator.kubeflow.org"
	}
	if err := hooks.Install(cfg); err != nil {
		return fmt.Errorf("installing the webhooks: %w", err)
	}
	defer hooks.Cleanup()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: hooks.LocalServingHost, Port: hooks.LocalServingPort, CertDir: hooks.LocalServingCertDir,
		}),
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	gang := common.GenNonGangSchedulerSetupFunc()
	if err := pytorch.NewReconciler(mgr, gang).SetupWithManager(mgr, 1); err != nil {
		return fmt.Errorf("pytorchjob controller: %w", err)
	}
	if err := pytorchwebhook.SetupWebhook(mgr); err != nil {
		return fmt.Errorf("pytorchjob webhook: %w", err)
	}
	if err := tensorflow.NewReconciler(mgr, gang).SetupWithManager(mgr, 1); err != nil {
		return fmt.Errorf("tfjob controller: %w", err)
	}
	if err := tensorflowwebhook.SetupWebhook(mgr); err != nil {
		return fmt.Errorf("tfjob webhook: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	failed := make(chan error, 1)
	go func() { failed <- mgr.Start(ctx) }()
	addr := net.JoinHostPort(hooks.LocalServingHost, fmt.Sprint(hooks.LocalServingPort))
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-failed:
			return fmt.Errorf("the manager stopped: %v", err)
		default:
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the webhook server at %s did not answer: %v", addr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ready, _ := json.Marshal(map[string]string{"webhook": addr})
	fmt.Println(string(ready))

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	closed := make(chan struct{})
	go func() { io.Copy(io.Discard, os.Stdin); close(closed) }()
	select {
	case <-stop:
	case <-closed:
	case err := <-failed:
		return fmt.Errorf("the manager stopped: %v", err)
	}
	return nil
}
