//go:build kfp2_15

package main

// What KFP 2.15.0's backend/src/v2/cmd/driver/main.go sets on driver.Options beyond what every release sets:
// nothing. Its Options literal (main.go:199-219) has no API server address, pipeline job times, plugin dispatcher or
// admin security defaults, and its CONTAINER case (main.go:228-231) sets only the container and Kubernetes config.

import "github.com/kubeflow/pipelines/backend/src/v2/driver"

const release = "2.15.0"

func releaseOptions(options *driver.Options, f *driverFlags) error { return nil }

func containerOptions(options *driver.Options, f *driverFlags) error { return nil }
