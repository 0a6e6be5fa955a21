package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlpkg "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	jobsetv1alpha2 "sigs.k8s.io/jobset/api/jobset/v1alpha2"
	jobsetcontrollers "sigs.k8s.io/jobset/pkg/controllers"
	jobsetwebhooks "sigs.k8s.io/jobset/pkg/webhooks"
	schedulerpluginsv1alpha1 "sigs.k8s.io/scheduler-plugins/apis/scheduling/v1alpha1"
	volcanov1beta1 "volcano.sh/apis/pkg/apis/scheduling/v1beta1"

	trainer "github.com/kubeflow/trainer/v2/pkg/apis/trainer/v1alpha1"
	trainercontroller "github.com/kubeflow/trainer/v2/pkg/controller"
	runtimecore "github.com/kubeflow/trainer/v2/pkg/runtime/core"
	trainerwebhooks "github.com/kubeflow/trainer/v2/pkg/webhooks"
)

// withTrainer installs Trainer's validating and defaulting webhooks as its integration tests do (v2.3.0
// test/integration/framework/framework.go:67-69); trainerDir is the module's folder in Go's module cache. The
// scheduler-plugins and Volcano PodGroup CRDs that framework also installs are copied by its Makefile from other
// modules and a download (Makefile:144-166), not in the module; without them the coscheduling and volcano plugins
// log "PodGroup CRDs must be installed in advance" and watch nothing (pkg/runtime/framework/plugins/
// coscheduling/coscheduling.go:260-267, volcano/volcano.go:333-340), which no runtime of ours uses.
func withTrainer(env *envtest.Environment, trainerDir string) {
	// the namespaced TrainingRuntime, which Trainer's runtimes index (pkg/runtime/core/trainingruntime.go) and
	// tests/schemas does not vendor; its TrainJob and ClusterTrainingRuntime CRDs there are these files' copies
	env.CRDDirectoryPaths = append(env.CRDDirectoryPaths,
		filepath.Join(trainerDir, "manifests", "base", "crds", "trainer.kubeflow.org_trainingruntimes.yaml"))
	env.WebhookInstallOptions = envtest.WebhookInstallOptions{
		Paths: []string{filepath.Join(trainerDir, "manifests", "base", "webhook", "manifests.yaml")},
	}
}

// withJobSetWebhooks installs JobSet's defaulting and validating webhooks for JobSets and Pods as its own webhook
// integration tests do (v0.12.0 test/integration/webhook/suite_test.go:70-72, the configurations of
// config/components/webhook/manifests.yaml). Those configurations are named as Trainer's
// (mutating-webhook-configuration, validating-webhook-configuration), so a copy renamed jobset-... is installed.
func withJobSetWebhooks(env *envtest.Environment, jobsetDir string) error {
	data, err := os.ReadFile(filepath.Join(jobsetDir, "config", "components", "webhook", "manifests.yaml"))
	if err != nil {
		return err
	}
	renamed := strings.NewReplacer("name: mutating-webhook-configuration", "name: jobset-mutating-webhook-configuration",
		"name: validating-webhook-configuration", "name: jobset-validating-webhook-configuration").Replace(string(data))
	if renamed == string(data) {
		return fmt.Errorf("JobSet's webhook configurations are no longer named as expected in %s", jobsetDir)
	}
	dir, err := os.MkdirTemp("", "jobset-webhooks-")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, "manifests.yaml")
	if err := os.WriteFile(path, []byte(renamed), 0o600); err != nil {
		return err
	}
	env.WebhookInstallOptions.Paths = append(env.WebhookInstallOptions.Paths, path)
	return nil
}

// runControllers starts one controller-runtime manager on envtest's rest config with the Trainer controllers and
// webhooks set up as Trainer's framework.RunManager does (framework.go:76-137) and JobSet's JobSet and Pod
// reconcilers as JobSet v0.12.0's test/integration/controller/suite_test.go sets them up; with jobsetWebhooks, also
// JobSet's webhooks (pkg/webhooks/setup.go:21-29, as test/integration/webhook/suite_test.go:118 sets them up). It
// returns when the webhook server answers; cancelling ctx stops the manager.
func runControllers(ctx context.Context, env *envtest.Environment, verbose, jobsetWebhooks bool) error {
	ctrl.SetLogger(zap.New(zap.UseDevMode(verbose)))
	for _, add := range []func(*runtime.Scheme) error{
		trainer.AddToScheme, jobsetv1alpha2.AddToScheme, schedulerpluginsv1alpha1.AddToScheme,
		volcanov1beta1.AddToScheme,
	} {
		if err := add(scheme.Scheme); err != nil {
			return err
		}
	}
	hooks := &env.WebhookInstallOptions
	mgr, err := ctrl.NewManager(env.Config, manager.Options{
		Scheme:  scheme.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: hooks.LocalServingHost, Port: hooks.LocalServingPort, CertDir: hooks.LocalServingCertDir,
		}),
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	runtimes, err := runtimecore.New(ctx, mgr.GetClient(), mgr.GetFieldIndexer(), nil)
	if err != nil {
		return fmt.Errorf("trainer runtimes: %w", err)
	}
	if name, err := trainercontroller.SetupControllers(mgr, runtimes, ctrlpkg.Options{SkipNameValidation: ptr.To(true)}); err != nil {
		return fmt.Errorf("trainer controller %s: %w", name, err)
	}
	if name, err := trainerwebhooks.Setup(mgr, runtimes); err != nil {
		return fmt.Errorf("trainer webhook %s: %w", name, err)
	}
	jobsets := jobsetcontrollers.NewJobSetReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorder("jobset"))
	if err := jobsetcontrollers.SetupJobSetIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return fmt.Errorf("jobset indexes: %w", err)
	}
	if err := jobsets.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("jobset controller: %w", err)
	}
	pods := jobsetcontrollers.NewPodReconciler(mgr.GetClient(), mgr.GetScheme(), mgr.GetEventRecorder("pod"))
	if err := jobsetcontrollers.SetupPodIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return fmt.Errorf("jobset pod indexes: %w", err)
	}
	if err := pods.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("jobset pod controller: %w", err)
	}
	if jobsetWebhooks {
		if err := jobsetwebhooks.Setup(mgr); err != nil {
			return fmt.Errorf("jobset webhooks: %w", err)
		}
	}
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
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the webhook server at %s did not answer: %v", addr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
