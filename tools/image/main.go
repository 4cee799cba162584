// Command image builds the container image of `kubetask serve` without a
// container engine (go-containerregistry): from static binaries, one per
// platform, into one OCI index; see docs/deploy.md. `make image` runs it.
//
//	go run . -binary linux/amd64=bin/linux_amd64/kubetask -binary linux/arm64=... \
//	  -version v0.4.1 -revision <sha> -out bin/image
//
// It writes, in -out: oci/ (an OCI image layout of the index),
// kubetask-image.tar (that layout as one tar with Docker's manifest.json for
// -platform), sbom-<os>-<arch>.cdx.json (CycloneDX, per platform) and
// digest (the index's digest). Every time in them is -epoch
// ($SOURCE_DATE_EPOCH): two builds of the same inputs give the same bytes.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

type binaries map[string]string

func (b binaries) String() string { return fmt.Sprint(map[string]string(b)) }
func (b binaries) Set(v string) error {
	p, file, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("want PLATFORM=FILE, such as linux/amd64=bin/linux_amd64/kubetask, got %q", v)
	}
	b[p] = file
	return nil
}

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	spec := Spec{Binaries: binaries{}}
	fs.Var(binaries(spec.Binaries), "binary", "PLATFORM=FILE: the static kubetask binary of a platform (repeat for each)")
	fs.StringVar(&spec.CABundle, "ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "PEM CA bundle for /etc/ssl/certs/ca-certificates.crt")
	caVersion := fs.String("ca-version", "", "version of the CA bundle's package, for the SBOM (dpkg-query -W -f '${Version}' ca-certificates)")
	fs.StringVar(&spec.Source, "source", "https://github.com/kubetask/kubetask", "label org.opencontainers.image.source")
	fs.StringVar(&spec.Revision, "revision", "", "label org.opencontainers.image.revision: the commit")
	fs.StringVar(&spec.Version, "version", "", "label org.opencontainers.image.version and the image's tag")
	epoch := fs.String("epoch", os.Getenv("SOURCE_DATE_EPOCH"), "every time in the image, seconds since 1970 (default $SOURCE_DATE_EPOCH)")
	repo := fs.String("repository", "ghcr.io/kubetask/kubetask", "the image's name, without tag")
	var tags list
	fs.Var(&tags, "tag", "another tag of the image besides -version (repeat)")
	platform := fs.String("platform", "linux/"+runtime.GOARCH, "the platform whose image the tar's manifest.json names (docker load, podman load)")
	out := fs.String("out", "", "output directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("-out is required")
	}
	secs, err := strconv.ParseInt(*epoch, 10, 64)
	if err != nil {
		return fmt.Errorf("-epoch (or $SOURCE_DATE_EPOCH) %q: want seconds since 1970, such as $(git log -1 --format=%%ct)", *epoch)
	}
	spec.Created = time.Unix(secs, 0).UTC()

	idx, err := Build(spec)
	if err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	ref := *repo + ":" + spec.Version
	layoutDir := filepath.Join(*out, "oci")
	if err := WriteLayout(layoutDir, idx, ref, spec.Version); err != nil {
		return err
	}
	refs := []string{ref}
	for _, t := range tags {
		refs = append(refs, *repo+":"+t)
	}
	archive := filepath.Join(*out, "kubetask-image.tar")
	if err := WriteArchive(archive, layoutDir, idx, *platform, refs, spec.Created); err != nil {
		return err
	}
	platforms := make([]string, 0, len(spec.Binaries))
	for p := range spec.Binaries {
		platforms = append(platforms, p)
	}
	sort.Strings(platforms)
	for _, p := range platforms {
		f := filepath.Join(*out, "sbom-"+strings.ReplaceAll(p, "/", "-")+".cdx.json")
		w, err := os.Create(f)
		if err != nil {
			return err
		}
		if err := WriteSBOM(w, spec, spec.Binaries[p], *caVersion); err != nil {
			_ = w.Close()
			return err
		}
		if err := w.Close(); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(*out, "digest"), []byte(digest.String()+"\n"), 0o644); err != nil {
		return err
	}
	return report(stdout, idx, ref, *out)
}
