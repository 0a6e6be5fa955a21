//go:build argo3

package main

// Argo Workflows v3, which KFP 2.5 to 2.16 pin (their go.mod): the workflow types the walk reads and the pod spec patch
// merge of its controller (argo_v4.go is the same for 2.17, which pins v4).

import (
	wfapi "github.com/argoproj/argo-workflows/v3/pkg/apis/workflow/v1alpha1"
	argoutil "github.com/argoproj/argo-workflows/v3/workflow/util"
)

type (
	wfTemplate  = wfapi.Template
	wfDAGTask   = wfapi.DAGTask
	wfParameter = wfapi.Parameter
)

var (
	wfAnyStringPtr    = wfapi.AnyStringPtr
	applyPodSpecPatch = argoutil.ApplyPodSpecPatch
)
