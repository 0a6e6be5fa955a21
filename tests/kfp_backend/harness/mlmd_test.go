package main

// The in-memory store answers the driver's own metadata client (backend/src/v2/metadata/client.go) the way ML
// Metadata does in the cases upstream's tests feed the driver (driver/container_test.go at 2.17.0, whose mock
// returns AlreadyExists for a repeated execution and found/empty answers for lookups).

import (
	"context"
	"testing"

	"github.com/kubeflow/pipelines/backend/src/v2/metadata"
	pb "github.com/kubeflow/pipelines/third_party/ml-metadata/go/ml_metadata"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func storeClient(t *testing.T) *metadata.Client {
	t.Helper()
	host, port, err := newMemoryMLMD().serve()
	if err != nil {
		t.Fatal(err)
	}
	client, err := metadata.NewClient(host, port, nil)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

func TestPipelineContextIsCreatedOnceAndFoundAgain(t *testing.T) {
	ctx, client := context.Background(), storeClient(t)
	first, err := client.GetPipeline(ctx, "p", "run-1", "kubeflow", "res", "gs://b/root", "{}")
	if err != nil {
		t.Fatal(err)
	}
	again, err := client.GetPipeline(ctx, "p", "run-1", "kubeflow", "res", "gs://b/root", "{}")
	if err != nil {
		t.Fatal(err)
	}
	// the run's root is the pipeline root with the pipeline and run below it (client.go GetPipeline)
	if first.GetRunCtxID() != again.GetRunCtxID() || again.GetPipelineRoot() != "gs://b/root/p/run-1" {
		t.Fatalf("run context %d then %d (root %q)", first.GetRunCtxID(), again.GetRunCtxID(), again.GetPipelineRoot())
	}
}

// repeatedExecution creates the execution run-1-train twice: the second is AlreadyExists.
func repeatedExecution(t *testing.T) (context.Context, *metadata.Client, *metadata.Execution) {
	ctx, client := context.Background(), storeClient(t)
	pipeline, err := client.GetPipeline(ctx, "p", "run-1", "kubeflow", "res", "gs://b/root", "{}")
	if err != nil {
		t.Fatal(err)
	}
	config := &metadata.ExecutionConfig{TaskName: "train", Name: "run-1-train", ExecutionType: metadata.ContainerExecutionTypeName}
	created, err := client.CreateExecution(ctx, pipeline, config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CreateExecution(ctx, pipeline, config); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("a second execution of the same name: %v, want AlreadyExists", err)
	}
	return ctx, client, created
}

func TestARepeatedExecutionIsAlreadyExists(t *testing.T) {
	repeatedExecution(t)
}

func TestExecutionsInADagAreTheDagsOwn(t *testing.T) {
	ctx, client := context.Background(), storeClient(t)
	pipeline, err := client.GetPipeline(ctx, "p", "run-1", "kubeflow", "res", "gs://b/root", "{}")
	if err != nil {
		t.Fatal(err)
	}
	root, err := client.CreateExecution(ctx, pipeline, &metadata.ExecutionConfig{TaskName: "root",
		ExecutionType: metadata.DagExecutionTypeName})
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range []string{"a", "b"} {
		if _, err := client.CreateExecution(ctx, pipeline, &metadata.ExecutionConfig{TaskName: task,
			ExecutionType: metadata.ContainerExecutionTypeName, ParentDagID: root.GetID()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.CreateExecution(ctx, pipeline, &metadata.ExecutionConfig{TaskName: "elsewhere",
		ExecutionType: metadata.ContainerExecutionTypeName, ParentDagID: root.GetID() + 100}); err != nil {
		t.Fatal(err)
	}
	dag, err := client.GetDAG(ctx, root.GetID())
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := client.GetExecutionsInDAG(ctx, dag, pipeline, true)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, execution := range tasks {
		names[execution.TaskName()] = true
	}
	if len(tasks) != 2 || !names["a"] || !names["b"] {
		t.Fatalf("executions in the DAG: %v, want a and b", tasks)
	}
}

func TestAnUnknownTypeIsNotFound(t *testing.T) {
	store := newMemoryMLMD()
	_, err := store.GetContextType(context.Background(), &pb.GetContextTypeRequest{TypeName: new(string)})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("%v, want NotFound", err)
	}
}
