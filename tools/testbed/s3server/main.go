// An S3 server for the weights tests (tests/store_servers.py, benchmarks/store_bench.py,
// the node tier): Versity's S3 gateway (versitygw) on its posix backend, embedded the way
// its embedgw package documents, so no Azure, ScoutFS or proxy backend and no CLI is
// linked. Objects are plain files under ROOT/<bucket>/<key> (metadata in a sidecar
// directory, so tmpfs without user xattrs works), behind SigV4 authentication.
//
//	s3server -root DIR -listen 127.0.0.1:PORT   (keys from S3SERVER_ACCESS_KEY / S3SERVER_SECRET_KEY)
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/versity/versitygw/backend/meta"
	"github.com/versity/versitygw/backend/posix"
	"github.com/versity/versitygw/embedgw"
)

func main() {
	root := flag.String("root", "", "directory holding one folder per bucket")
	listen := flag.String("listen", "127.0.0.1:7070", "host:port of the S3 API")
	region := flag.String("region", "us-east-1", "region reported to clients")
	flag.Parse()
	access, secret := os.Getenv("S3SERVER_ACCESS_KEY"), os.Getenv("S3SERVER_SECRET_KEY")
	if *root == "" || access == "" || secret == "" {
		log.Fatal("s3server: need -root and S3SERVER_ACCESS_KEY / S3SERVER_SECRET_KEY")
	}
	sidecar := filepath.Join(*root, ".sidecar")
	if err := os.MkdirAll(sidecar, 0o700); err != nil {
		log.Fatal(err)
	}
	ms, err := meta.NewSideCar(sidecar)
	if err != nil {
		log.Fatal(err)
	}
	be, err := posix.New(*root, ms, posix.PosixOpts{ValidateBucketNames: true})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg := &embedgw.Config{
		RootUserAccess: access, RootUserSecret: secret, Region: *region,
		Ports: []string{*listen}, MaxConnections: 1000, MaxRequests: 1000,
		MultipartMaxParts: 10000, Quiet: true, KeepAlive: true,
	}
	if err := embedgw.RunVersityGW(ctx, be, cfg); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}
