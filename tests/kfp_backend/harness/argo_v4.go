//go:build !argo3

package main

// Argo Workflows v4, which KFP 2.17 pins (its go.mod): the workflow types the walk reads and the pod spec patch
// merge of its controller (argo_v3.go is the same for the releases that pin Argo v3).

import (
	wfapi "github.com/argoproj/argo-workflows/v4/pkg/apis/workflow/v1alpha1"
	argoutil "github.com/argoproj/argo-workflows/v4/workflow/util"
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
