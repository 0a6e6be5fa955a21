//go:build !kfp2_15

package main

// The driver's metadata client looks an execution up by type and name from 2.16 on
// (backend/src/v2/metadata/client.go:823 at 2.16.1, :906 at 2.17.0; 2.15.0's client has no such method): the store
// finds the execution that a repeated create answered AlreadyExists for.

import (
	"testing"

	"github.com/kubeflow/pipelines/backend/src/v2/metadata"
)

func TestARepeatedExecutionIsFoundByName(t *testing.T) {
	ctx, client, created := repeatedExecution(t)
	found, err := client.GetExecutionByTypeAndName(ctx, string(metadata.ContainerExecutionTypeName), "run-1-train")
	if err != nil || found.GetID() != created.GetID() {
		t.Fatalf("found %v (%v), want execution %d", found, err, created.GetID())
	}
}
