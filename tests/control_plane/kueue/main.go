// Command control-plane-kueue runs Kueue v0.19.2's controllers, scheduler and webhooks against the API server of
// tests/control_plane/harness (a kubeconfig it wrote), set up the way Kueue's own integration tests set them up:
// test/integration/framework/framework.go:95-143 (Init: the CRDs with conversion webhooks on the local webhook
// server, the webhook configuration) and :198-246 (StartManager: one controller-runtime manager whose webhook server
// serves envtest's local host, port and certificates), and test/integration/singlecluster/controller/jobs/trainjob/
// suite_test.go:71-140 and jobs/jobset/suite_test.go:69-131 (the TrainJob and JobSet integrations, Kueue's core
// controllers and webhooks, its scheduler). It is its own module because Kueue v0.19.2 is built against Kubeflow
// Trainer v2.2.1 (its go.mod:14), the harness against v2.3.0: a released Kueue reads TrainJobs with v2.2.1's types.
//
// It installs Kueue's CRDs and webhook configurations from the release's manifests.yaml (--manifests: the
// rendering vendored in tests/cluster_setup), the webhooks pointed at its own server as envtest points them
// (envtest.WebhookInstallOptions); of the release's webhooks it installs those this binary serves (Kueue's core
// kinds, TrainJob, JobSet): the API server would refuse the kinds of the integrations left out (Job, Pod, ...)
// when calling a webhook nothing serves. It prints one JSON line {"webhook": "host:port"} on stdout when the
// webhooks answer, and serves until stdin closes or it gets SIGINT/SIGTERM.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	kftrainer "github.com/kubeflow/trainer/v2/pkg/apis/trainer/v1alpha1"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	jobsetapi "sigs.k8s.io/jobset/api/jobset/v1alpha2"

	config "sigs.k8s.io/kueue/apis/config/v1beta2"
	kueuev1beta1 "sigs.k8s.io/kueue/apis/kueue/v1beta1"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"
	qcache "sigs.k8s.io/kueue/pkg/cache/queue"
	schdcache "sigs.k8s.io/kueue/pkg/cache/scheduler"
	"sigs.k8s.io/kueue/pkg/constants"
	"sigs.k8s.io/kueue/pkg/controller/core"
	"sigs.k8s.io/kueue/pkg/controller/core/indexer"
	"sigs.k8s.io/kueue/pkg/controller/jobframework"
	"sigs.k8s.io/kueue/pkg/controller/jobs/jobset"
	"sigs.k8s.io/kueue/pkg/controller/jobs/trainjob"
	"sigs.k8s.io/kueue/pkg/scheduler"
	preemptexpectations "sigs.k8s.io/kueue/pkg/scheduler/preemption/expectations"
	"sigs.k8s.io/kueue/pkg/webhooks"
)

func main() {
	// --kubeconfig (the API server's, a system:masters user) is controller-runtime's own flag (pkg/client/config)
	manifests := flag.String("manifests", "", "Kueue's release manifests.yaml: its CRDs and webhook configurations")
	verbose := flag.Bool("v", false, "Kueue's debug logs on stderr")
	flag.Parse()
	if flag.Lookup("kubeconfig").Value.String() == "" || *manifests == "" {
		fmt.Fprintln(os.Stderr, "usage: control-plane-kueue --kubeconfig FILE --manifests MANIFESTS.yaml")
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseDevMode(*verbose)))
	ctx, cancel := context.WithCancel(context.Background())
	addr, err := run(ctx, *manifests)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting Kueue:", err)
		cancel()
		os.Exit(1)
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
	}
	cancel()
}

func run(ctx context.Context, manifests string) (string, error) {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return "", err
	}
	// the manager's scheme: framework.go:140-186 SetupClient, less the kinds of the integrations left out
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, config.AddToScheme, kueue.AddToScheme, kueuev1beta1.AddToScheme,
		jobsetapi.AddToScheme, kftrainer.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return "", err
		}
	}

	// framework.go:101-116: the CRDs, with their conversion webhooks (v1beta1 <-> v1beta2) on the local server
	hooks := envtest.WebhookInstallOptions{Paths: []string{manifests}, LocalServingHost: "127.0.0.1"}
	if err := hooks.PrepWithoutInstalling(); err != nil {
		return "", fmt.Errorf("webhook certificates: %w", err)
	}
	if _, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{
		Paths: []string{manifests}, ErrorIfPathMissing: true, Scheme: scheme, WebhookOptions: hooks,
	}); err != nil {
		return "", fmt.Errorf("installing Kueue's CRDs: %w", err)
	}

	// framework.go:198-219 StartManager
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: hooks.LocalServingHost, Port: hooks.LocalServingPort, CertDir: hooks.LocalServingCertDir,
		}),
		Controller: crconfig.Controller{SkipNameValidation: new(true)},
	})
	if err != nil {
		return "", fmt.Errorf("creating the manager: %w", err)
	}
	if err := setup(ctx, mgr); err != nil {
		return "", err
	}
	failed := make(chan error, 1)
	go func() { failed <- mgr.Start(ctx) }()

	// framework.go:237-244: wait for the webhook server
	addr := net.JoinHostPort(hooks.LocalServingHost, fmt.Sprint(hooks.LocalServingPort))
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-failed:
			return "", fmt.Errorf("the manager stopped: %v", err)
		default:
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the webhook server at %s did not answer: %v", addr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	served := func(cc admissionv1.WebhookClientConfig) bool {
		if cc.URL == nil {
			return false
		}
		u, err := url.Parse(*cc.URL)
		if err != nil {
			return false
		}
		_, pattern := mgr.GetWebhookServer().WebhookMux().Handler(&http.Request{Method: http.MethodPost, URL: u, Host: u.Host})
		return pattern != ""
	}
	for _, c := range hooks.MutatingWebhooks {
		var kept []admissionv1.MutatingWebhook
		for _, w := range c.Webhooks {
			if served(w.ClientConfig) {
				kept = append(kept, w)
			}
		}
		c.Webhooks = kept
	}
	for _, c := range hooks.ValidatingWebhooks {
		var kept []admissionv1.ValidatingWebhook
		for _, w := range c.Webhooks {
			if served(w.ClientConfig) {
				kept = append(kept, w)
			}
		}
		c.Webhooks = kept
	}
	if err := hooks.Install(cfg); err != nil {
		return "", fmt.Errorf("installing Kueue's webhook configurations: %w", err)
	}
	return addr, nil
}

// setup: trainjob/suite_test.go:102-140 controllersSetup and :78-100 managerAndSchedulerSetup, with the JobSet
// integration of jobset/suite_test.go:69-87 beside it, and the integrations enabled as a default configuration
// enables them (cmd/kueue/main.go:584-607 passes cfg.Integrations.Frameworks and the manager name to jobframework).
func setup(ctx context.Context, mgr manager.Manager) error {
	configuration := &config.Configuration{}
	mgr.GetScheme().Default(configuration)

	cCache := schdcache.New(mgr.GetClient())
	preemptionExpectations := preemptexpectations.New()
	// test/util/factory.go:28-39 NewManagerForIntegrationTests (cmd/kueue/main.go:364-375 adds the requeuer to the
	// manager with its default batch period instead)
	requeuer := qcache.NewRequeuer(qcache.WithBatchPeriod(100 * time.Millisecond))
	go func() { _ = requeuer.Start(ctx) }()
	queues := qcache.NewManager(mgr.GetClient(), cCache, requeuer, qcache.WithPreemptionExpectations(preemptionExpectations))

	opts := []jobframework.Option{
		jobframework.WithCache(cCache), jobframework.WithQueues(queues),
		jobframework.WithManagerName(constants.KueueName),
		jobframework.WithEnabledFrameworks(configuration.Integrations.Frameworks),
	}
	if err := indexer.Setup(ctx, mgr.GetFieldIndexer()); err != nil {
		return fmt.Errorf("kueue indexes: %w", err)
	}
	trainjobs, err := trainjob.NewReconciler(ctx, mgr.GetClient(), mgr.GetFieldIndexer(),
		mgr.GetEventRecorder(constants.JobControllerName), opts...)
	if err != nil {
		return fmt.Errorf("the TrainJob reconciler: %w", err)
	}
	if err := trainjob.SetupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return fmt.Errorf("TrainJob indexes: %w", err)
	}
	if err := trainjobs.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("the TrainJob controller: %w", err)
	}
	if err := trainjob.SetupTrainJobWebhook(mgr, opts...); err != nil {
		return fmt.Errorf("the TrainJob webhook: %w", err)
	}
	jobsets, err := jobset.NewReconciler(ctx, mgr.GetClient(), mgr.GetFieldIndexer(),
		mgr.GetEventRecorder(constants.JobControllerName), opts...)
	if err != nil {
		return fmt.Errorf("the JobSet reconciler: %w", err)
	}
	if err := jobset.SetupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return fmt.Errorf("JobSet indexes: %w", err)
	}
	if err := jobsets.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("the JobSet controller: %w", err)
	}
	if err := jobset.SetupJobSetWebhook(mgr, opts...); err != nil {
		return fmt.Errorf("the JobSet webhook: %w", err)
	}
	if name, err := core.SetupControllers(mgr, queues, cCache, configuration,
		core.SetupControllersOpts{PreemptionExpectations: preemptionExpectations}); err != nil {
		return fmt.Errorf("kueue controller %s: %w", name, err)
	}
	if name, err := webhooks.Setup(mgr, nil); err != nil {
		return fmt.Errorf("kueue webhook %s: %w", name, err)
	}
	sched := scheduler.New(queues, cCache, mgr.GetClient(), mgr.GetEventRecorder(constants.AdmissionName),
		scheduler.WithPreemptionExpectations(preemptionExpectations))
	return sched.Start(ctx)
}
