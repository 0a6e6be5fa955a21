package main

// The launcher's copy rule, run for real: objectstore.DownloadBlob (backend/src/v2/objectstore/object_store.go,
// 2.17.0:176-204) on an in-memory gocloud bucket (memblob) holding the given keys, each object's content its own
// key, so that what lands in the local folder says which objects were copied.

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/kubeflow/pipelines/backend/src/v2/objectstore"
	"gocloud.dev/blob/memblob"
)

func downloadCheck(keysJSON, blobDir string) error {
	var keys []string
	if err := json.Unmarshal([]byte(keysJSON), &keys); err != nil {
		return fmt.Errorf("--download-objects: %w", err)
	}
	ctx := context.Background()
	bucket := memblob.OpenBucket(nil)
	defer bucket.Close()
	for _, key := range keys {
		if err := bucket.WriteAll(ctx, key, []byte(key), nil); err != nil {
			return err
		}
	}
	localDir, err := os.MkdirTemp("", "kfp-download")
	if err != nil {
		return err
	}
	defer os.RemoveAll(localDir)
	target := filepath.Join(localDir, "artifact") // the launcher's local path of the artifact
	if err := objectstore.DownloadBlob(ctx, bucket, target, blobDir); err != nil {
		return err
	}
	copied := []string{}
	err = filepath.WalkDir(localDir, func(path string, entry fs.DirEntry, err error) error {
		if err != nil || entry.IsDir() {
			return err
		}
		content, err := os.ReadFile(path)
		copied = append(copied, string(content))
		return err
	})
	if err != nil {
		return err
	}
	sort.Strings(copied)
	data, _ := json.Marshal(copied)
	fmt.Println(string(data))
	return nil
}
