package main

import (
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// report prints the index's digest and each platform image's digest and
// compressed size (what a registry stores and a node pulls).
func report(w io.Writer, idx v1.ImageIndex, ref, out string) error {
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%s@%s\n", ref, digest)
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			return err
		}
		size, err := compressedSize(img)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "  %s/%s %s  %.1f MB compressed\n", d.Platform.OS, d.Platform.Architecture, d.Digest, float64(size)/1e6)
	}
	fmt.Fprintf(w, "wrote %s/oci (OCI layout), %s/kubetask-image.tar (docker load, podman load, ctr images import, kind load image-archive, crane push), %s/sbom-*.cdx.json\n", out, out, out)
	return nil
}

// compressedSize is the size of the image's config and compressed layers.
func compressedSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	n := m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}
