// Command kfp-backend runs Kubeflow Pipelines' own backend code on a compiled pipeline: the API server's path from
// the pipeline YAML to the Argo Workflow (template.NewV2SpecTemplate, then V2Spec.RunWorkflow, which calls
// argocompiler.Compile), then the workflow's DAG with the real drivers (driver.RootDAG, driver.DAG,
// driver.Container), and prints, per task, the pod Argo would create (the driver's pod spec patch merged onto the
// executor template by Argo's own util.ApplyPodSpecPatch), the executor input and the trigger condition, as JSON.
//
// Stand-ins, in-process: an in-memory MLMD gRPC server (mlmd.go), a Kubernetes API that answers 404 (so the
// kfp-launcher ConfigMap is absent), a disabled cache, and the launcher's part (publishing outputs) done with the
// driver's own metadata client from fixed outputs given on the command line.
//
// Usage: kfp-backend --pipeline P.yaml [--params JSON] [--outputs JSON] [--pipeline-root URI]
//
//	or:  kfp-backend --download-objects '["k1", ...]' --download-key KEY   (what the launcher copies: download.go)
//
//	--params   the run's parameter values, {"name": value}
//	--outputs  fixed output parameters of tasks whose outputs others read, {"task": {"output": value}}
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/kubeflow/pipelines/api/v2alpha1/go/pipelinespec"
	"github.com/kubeflow/pipelines/backend/src/apiserver/config/proxy"
	"github.com/kubeflow/pipelines/backend/src/apiserver/model"
	"github.com/kubeflow/pipelines/backend/src/apiserver/template"
	"github.com/kubeflow/pipelines/backend/src/common/util"
	"github.com/kubeflow/pipelines/backend/src/v2/metadata"
	"github.com/kubeflow/pipelines/backend/src/v2/objectstore"
	pb "github.com/kubeflow/pipelines/third_party/ml-metadata/go/ml_metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

type taskResult struct {
	Task          string            `json:"task"`
	Pod           json.RawMessage   `json:"pod,omitempty"`
	TemplatePod   json.RawMessage   `json:"template_pod,omitempty"` // the executor template's, before the patch
	Labels        map[string]string `json:"labels,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
	ExecutorInput json.RawMessage   `json:"executor_input,omitempty"`
	Condition     *bool             `json:"condition,omitempty"`
	Cached        *bool             `json:"cached,omitempty"`
	Skipped       string            `json:"skipped,omitempty"`
	Error         string            `json:"error,omitempty"`
}

type report struct {
	Release  string       `json:"release"`
	Workflow string       `json:"workflow_api_version"`
	Tasks    []taskResult `json:"tasks"`
}

func main() {
	pipelinePath := flag.String("pipeline", "", "compiled pipeline YAML")
	paramsJSON := flag.String("params", "{}", "run parameter values as a JSON object")
	outputsJSON := flag.String("outputs", "{}", "fixed output parameters per task as a JSON object")
	pipelineRoot := flag.String("pipeline-root", "gs://BUCKET/pipeline-root", "the run's pipeline root")
	workflowOut := flag.String("workflow-out", "", "also write the compiled Argo Workflow (JSON) here")
	downloadObjects := flag.String("download-objects", "", "instead: the keys of a bucket (JSON list) ...")
	downloadKey := flag.String("download-key", "", "... and the artifact key whose download to print (download.go)")
	flag.Parse()
	if *downloadObjects != "" {
		if err := downloadCheck(*downloadObjects, *downloadKey); err != nil {
			fmt.Fprintln(os.Stderr, "kfp-backend:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*pipelinePath, *paramsJSON, *outputsJSON, *pipelineRoot, *workflowOut); err != nil {
		fmt.Fprintln(os.Stderr, "kfp-backend:", err)
		os.Exit(1)
	}
}

// fakeKubernetes is an API server that has nothing: every GET answers 404, as the kfp-launcher ConfigMap's GET
// does on a cluster without one. util.GetKubernetesConfig (backend/src/common/util/service.go) falls back from
// the in-cluster config to KUBECONFIG, which points here.
func fakeKubernetes(dir string) (func(), error) {
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,`+
			`"message":"%s not found"}`, r.URL.Path)
	}))
	kubeconfig := filepath.Join(dir, "kubeconfig")
	content := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {server: %q}\n"+
		"contexts:\n- name: fake\n  context: {cluster: fake, user: fake, namespace: kubeflow}\ncurrent-context: fake\n"+
		"users:\n- name: fake\n  user: {token: fake}\n", server.URL)
	if err := os.WriteFile(kubeconfig, []byte(content), 0o600); err != nil {
		server.Close()
		return nil, err
	}
	os.Setenv("KUBECONFIG", kubeconfig)
	os.Unsetenv("KUBERNETES_SERVICE_HOST") // so rest.InClusterConfig fails, as outside a pod
	return server.Close, nil
}

func run(pipelinePath, paramsJSON, outputsJSON, pipelineRoot, workflowOut string) error {
	source, err := os.ReadFile(pipelinePath)
	if err != nil {
		return err
	}
	var outputs map[string]map[string]any
	if err := json.Unmarshal([]byte(outputsJSON), &outputs); err != nil {
		return fmt.Errorf("--outputs: %w", err)
	}
	dir, err := os.MkdirTemp("", "kfp-backend")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	stop, err := fakeKubernetes(dir)
	if err != nil {
		return err
	}
	defer stop()
	// config.InPodNamespace (backend/src/v2/config/env.go) reads the pod's namespace from the environment.
	os.Setenv("NAMESPACE", "kubeflow")

	workflow, err := compileWorkflow(source, paramsJSON, pipelineRoot)
	if err != nil {
		return err
	}
	if workflowOut != "" {
		data, _ := json.MarshalIndent(workflow, "", "  ")
		if err := os.WriteFile(workflowOut, data, 0o644); err != nil {
			return err
		}
	}
	store := newMemoryMLMD()
	host, port, err := store.serve()
	if err != nil {
		return err
	}
	client, err := newMetadataClient(host, port)
	if err != nil {
		return err
	}
	w := &walker{wf: workflow, mlmd: client, mlmdHost: host, mlmdPort: port, outputs: outputs,
		pipelineRoot: pipelineRoot}
	if err := w.runWorkflow(); err != nil {
		return err
	}
	data, err := json.MarshalIndent(report{Release: release, Workflow: workflow.APIVersion, Tasks: w.results}, "", "  ")
	if err != nil {
		return err
	}
	fmt.Println(string(data))
	return nil
}

// compileWorkflow is the API server's path for a run (backend/src/apiserver/resource/resource_manager.go
// CreateRun: template.New, then RunWorkflow with the run's runtime config).
func compileWorkflow(source []byte, paramsJSON, pipelineRoot string) (*util.Workflow, error) {
	// The API server's start-up (backend/src/apiserver/main.go:653); no proxy is set for this cluster.
	for _, name := range []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"} {
		os.Unsetenv(name)
	}
	proxy.InitializeConfigWithEnv()
	tmpl, err := template.NewV2SpecTemplate(source, template.TemplateOptions{CacheDisabled: true})
	if err != nil {
		return nil, fmt.Errorf("template.NewV2SpecTemplate: %w", err)
	}
	run := &model.Run{DisplayName: "run", PipelineSpec: model.PipelineSpec{RuntimeConfig: model.RuntimeConfig{
		Parameters: model.LargeText(paramsJSON), PipelineRoot: model.LargeText(pipelineRoot)}}}
	spec, err := tmpl.RunWorkflow(run, template.RunWorkflowOptions{RunID: "RUN_ID", RunAt: 0})
	if err != nil {
		return nil, fmt.Errorf("RunWorkflow (argocompiler.Compile): %w", err)
	}
	workflow, ok := spec.(*util.Workflow)
	if !ok {
		return nil, fmt.Errorf("RunWorkflow made a %T, not an Argo Workflow", spec)
	}
	return workflow, nil
}

// publishOutputs does the launcher's part for a task that ran: its output parameters (fixed by the caller) and the
// output artifacts of its executor input (the URIs the driver chose) are published on its execution with the
// driver's own metadata client, as launcher_v2.go does (uploadOutputArtifacts: RecordArtifact at :843-848 at
// 2.17.0, then PublishExecution).
func (w *walker) publishOutputs(ctx context.Context, executionID int64, run launched) error {
	execution, err := w.mlmd.GetExecution(ctx, executionID)
	if err != nil {
		return err
	}
	parameters := map[string]*structpb.Value{}
	for name, value := range w.outputs[run.task] {
		v, err := structpb.NewValue(value)
		if err != nil {
			return fmt.Errorf("--outputs %s.%s: %w", run.task, name, err)
		}
		parameters[name] = v
	}
	// launcher_v2.go:252-257: the bucket of the run's pipeline root, with the session the root DAG stored.
	storeSessionInfo, err := objectstore.GetSessionInfoFromString(execution.GetPipeline().GetStoreSessionInfo())
	if err != nil {
		return err
	}
	bucketConfig, err := objectstore.ParseBucketConfig(execution.GetPipeline().GetPipelineRoot(), storeSessionInfo)
	if err != nil {
		return err
	}
	var artifacts []*metadata.OutputArtifact
	for name, list := range run.executorInput.GetOutputs().GetArtifacts() {
		for _, runtimeArtifact := range list.GetArtifacts() {
			schema, err := artifactSchema(runtimeArtifact.GetType())
			if err != nil {
				return err
			}
			artifact, err := w.mlmd.RecordArtifact(ctx, name, schema, runtimeArtifact, pb.Artifact_LIVE, bucketConfig)
			if err != nil {
				return fmt.Errorf("record %s.%s: %w", run.task, name, err)
			}
			artifacts = append(artifacts, artifact)
		}
	}
	return w.mlmd.PublishExecution(ctx, execution, parameters, artifacts, pb.Execution_COMPLETE)
}

// artifactSchema is the launcher's getArtifactSchema (launcher_v2.go:1175-1186 at 2.17.0, unexported).
func artifactSchema(schema *pipelinespec.ArtifactTypeSchema) (string, error) {
	switch t := schema.Kind.(type) {
	case *pipelinespec.ArtifactTypeSchema_InstanceSchema:
		return t.InstanceSchema, nil
	case *pipelinespec.ArtifactTypeSchema_SchemaTitle:
		return "title: " + t.SchemaTitle, nil
	}
	return "", fmt.Errorf("unsupported artifact type %+v", schema)
}
