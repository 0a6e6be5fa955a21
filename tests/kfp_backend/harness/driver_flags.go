package main

// The driver's command line to driver.Options, as backend/src/v2/cmd/driver/main.go does (the main package cannot
// be imported); line numbers here are 2.17.0's, and options_*.go hold what differs per release with that release's
// lines. Its flags (main.go:63-111; an older release has a subset, and its compiler passes only those), the spec parsing in drive() (main.go:320-362, with
// util.UnmarshalString, which allows unknown fields), parseExecConfigJson (main.go:492-502), the Options literal
// (main.go:408-433) and the per-type switch (main.go:434-468). What main.go does around them that needs a cluster
// is left out and said so: the proxy config (main.go:332), the workflow metadata lookup for pipeline job time
// placeholders (main.go:387-407; this pipeline uses none, so the create time flag is passed through as the driver
// would resolve it).

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/kubeflow/pipelines/api/v2alpha1/go/pipelinespec"
	"github.com/kubeflow/pipelines/backend/src/common/util"
	"github.com/kubeflow/pipelines/backend/src/v2/cacheutils"
	"github.com/kubeflow/pipelines/backend/src/v2/driver"
	"github.com/kubeflow/pipelines/backend/src/v2/metadata"
	"github.com/kubeflow/pipelines/kubernetes_platform/go/kubernetesplatform"
)

type driverFlags struct {
	driverType, pipelineName, runID, runName, runDisplayName, createTime, scheduleEpoch string
	component, task, runtimeConfig, taskName, container, k8sConfig                      string
	mlPipelineAddress, mlPipelinePort, mlmdAddress, mlmdPort, logLevel, publishLogs     string
	caCertPath, defaultRunAsNonRoot, defaultHostUsers                                   string
	iterationIndex                                                                      int
	dagExecutionID, defaultRunAsUser, defaultRunAsGroup                                 int64
	cacheDisabled, mlPipelineTLS, metadataTLS                                           bool
	paths                                                                               map[string]*string
}

// parseDriverFlags reads a driver container's arguments with main.go:63-111's flags and defaults.
func parseDriverFlags(args []string) (*driverFlags, error) {
	f := &driverFlags{paths: map[string]*string{}}
	fs := flag.NewFlagSet("driver", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.driverType, "type", "", "")
	fs.StringVar(&f.pipelineName, "pipeline_name", "", "")
	fs.StringVar(&f.runID, "run_id", "", "")
	fs.StringVar(&f.runName, "run_name", "", "")
	fs.StringVar(&f.runDisplayName, "run_display_name", "", "")
	fs.StringVar(&f.createTime, "pipeline_job_create_time_utc", "", "")
	fs.StringVar(&f.scheduleEpoch, "pipeline_job_schedule_time_epoch_seconds", "", "")
	fs.StringVar(&f.component, "component", "{}", "")
	fs.StringVar(&f.task, "task", "", "")
	fs.StringVar(&f.runtimeConfig, "runtime_config", "", "")
	fs.IntVar(&f.iterationIndex, "iteration_index", -1, "")
	fs.StringVar(&f.taskName, "task_name", "", "")
	fs.Int64Var(&f.dagExecutionID, "dag_execution_id", 0, "")
	fs.StringVar(&f.container, "container", "{}", "")
	fs.StringVar(&f.k8sConfig, "kubernetes_config", "{}", "")
	fs.StringVar(&f.mlPipelineAddress, "ml_pipeline_server_address", "ml-pipeline", "")
	fs.StringVar(&f.mlPipelinePort, "ml_pipeline_server_port", "8887", "")
	fs.StringVar(&f.mlmdAddress, "mlmd_server_address", "", "")
	fs.StringVar(&f.mlmdPort, "mlmd_server_port", "", "")
	for _, name := range []string{"execution_id_path", "iteration_count_path", "pod_spec_patch_path",
		"cached_decision_path", "condition_path"} {
		f.paths[name] = fs.String(name, "", "")
	}
	fs.StringVar(&f.logLevel, "log_level", "1", "")
	for _, name := range []string{"http_proxy", "https_proxy", "no_proxy"} {
		fs.String(name, "unset", "")
	}
	fs.StringVar(&f.publishLogs, "publish_logs", "true", "")
	fs.BoolVar(&f.cacheDisabled, "cache_disabled", false, "")
	fs.BoolVar(&f.mlPipelineTLS, "ml_pipeline_tls_enabled", false, "")
	fs.BoolVar(&f.metadataTLS, "metadata_tls_enabled", false, "")
	fs.StringVar(&f.caCertPath, "ca_cert_path", "", "")
	fs.Int64Var(&f.defaultRunAsUser, "default_run_as_user", -1, "")
	fs.Int64Var(&f.defaultRunAsGroup, "default_run_as_group", -1, "")
	fs.StringVar(&f.defaultRunAsNonRoot, "default_run_as_non_root", "", "")
	fs.StringVar(&f.defaultHostUsers, "default_host_users", "", "")
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("driver arguments: %w", err)
	}
	return f, nil
}

// callDriver builds driver.Options as main.go:320-468 does and calls the driver the flags name. The metadata
// client is the driver's own (metadata.NewClient, main.go:585-587) on the in-memory store's address, and the cache
// client is cacheutils.NewClient with the compiled --cache_disabled (main.go:378), which makes no connection.
func callDriver(ctx context.Context, f *driverFlags, mlmdHost, mlmdPort string) (*driver.Execution, *pipelinespec.ComponentSpec, error) {
	componentSpec := &pipelinespec.ComponentSpec{}
	if err := util.UnmarshalString(f.component, componentSpec); err != nil {
		return nil, nil, fmt.Errorf("failed to unmarshal component spec: %w", err)
	}
	var taskSpec *pipelinespec.PipelineTaskSpec
	if f.task != "" {
		taskSpec = &pipelinespec.PipelineTaskSpec{}
		if err := util.UnmarshalString(f.task, taskSpec); err != nil {
			return nil, nil, fmt.Errorf("failed to unmarshal task spec: %w", err)
		}
	}
	containerSpec := &pipelinespec.PipelineDeploymentConfig_PipelineContainerSpec{}
	if err := util.UnmarshalString(f.container, containerSpec); err != nil {
		return nil, nil, fmt.Errorf("failed to unmarshal container spec: %w", err)
	}
	var runtimeConfig *pipelinespec.PipelineJob_RuntimeConfig
	if f.runtimeConfig != "" {
		runtimeConfig = &pipelinespec.PipelineJob_RuntimeConfig{}
		if err := util.UnmarshalString(f.runtimeConfig, runtimeConfig); err != nil {
			return nil, nil, fmt.Errorf("failed to unmarshal runtime config: %w", err)
		}
	}
	var k8sExecCfg *kubernetesplatform.KubernetesExecutorConfig
	if f.k8sConfig != "" {
		k8sExecCfg = &kubernetesplatform.KubernetesExecutorConfig{}
		if err := util.UnmarshalString(f.k8sConfig, k8sExecCfg); err != nil {
			return nil, nil, fmt.Errorf("failed to unmarshal Kubernetes config: %w", err)
		}
	}
	if f.mlmdAddress == "" || f.mlmdPort == "" {
		return nil, nil, fmt.Errorf("the compiled driver has no --mlmd_server_address/--mlmd_server_port")
	}
	// The compiled address is the cluster's metadata-grpc-service; the in-memory store stands in for it.
	client, err := metadata.NewClient(mlmdHost, mlmdPort, nil)
	if err != nil {
		return nil, nil, err
	}
	cacheClient, err := cacheutils.NewClient(f.mlPipelineAddress, f.mlPipelinePort, f.cacheDisabled, nil)
	if err != nil {
		return nil, nil, err
	}
	// The fields every built release's Options literal sets; releaseOptions (options_*.go) sets the rest.
	options := driver.Options{
		PipelineName:         f.pipelineName,
		RunID:                f.runID,
		RunName:              f.runName,
		RunDisplayName:       f.runDisplayName,
		Namespace:            "kubeflow", // config.InPodNamespace
		Component:            componentSpec,
		Task:                 taskSpec,
		DAGExecutionID:       f.dagExecutionID,
		IterationIndex:       f.iterationIndex,
		PipelineLogLevel:     f.logLevel,
		PublishLogs:          f.publishLogs,
		CacheDisabled:        f.cacheDisabled,
		DriverType:           f.driverType,
		TaskName:             f.taskName,
		MLMDServerAddress:    f.mlmdAddress,
		MLMDServerPort:       f.mlmdPort,
		MLPipelineTLSEnabled: f.mlPipelineTLS,
		MLMDTLSEnabled:       f.metadataTLS,
		CaCertPath:           f.caCertPath,
	}
	if err := releaseOptions(&options, f); err != nil {
		return nil, nil, err
	}
	var execution *driver.Execution
	switch f.driverType {
	case "ROOT_DAG":
		options.RuntimeConfig = runtimeConfig
		execution, err = driver.RootDAG(ctx, options, client)
	case "DAG":
		execution, err = driver.DAG(ctx, options, client)
	case "CONTAINER":
		options.Container = containerSpec
		options.KubernetesExecutorConfig = k8sExecCfg
		if err := containerOptions(&options, f); err != nil {
			return nil, nil, err
		}
		execution, err = driver.Container(ctx, options, client, cacheClient)
	default:
		return nil, nil, fmt.Errorf("unknown driverType %s", f.driverType)
	}
	return execution, componentSpec, err
}

// driverOutputFiles is what handleExecution (main.go:504-559) writes, by flag name of the path it writes to.
func driverOutputFiles(execution *driver.Execution, driverType string) map[string]string {
	files := map[string]string{}
	if execution.ID != 0 {
		files["execution_id_path"] = fmt.Sprint(execution.ID)
	}
	if execution.IterationCount != nil {
		files["iteration_count_path"] = fmt.Sprintf("%v", *execution.IterationCount)
	} else if driverType == "ROOT_DAG" || driverType == "DAG" {
		files["iteration_count_path"] = "0"
	}
	if execution.Cached != nil {
		files["cached_decision_path"] = strconv.FormatBool(*execution.Cached)
	}
	if execution.Condition != nil {
		files["condition_path"] = strconv.FormatBool(*execution.Condition)
	} else {
		files["condition_path"] = "nil"
	}
	if execution.PodSpecPatch != "" {
		files["pod_spec_patch_path"] = execution.PodSpecPatch
	}
	return files
}

func newMetadataClient(host, port string) (*metadata.Client, error) {
	return metadata.NewClient(host, port, nil)
}
