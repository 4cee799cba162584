package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/CycloneDX/cyclonedx-gomod/pkg/generate/bin"
	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// WriteSBOM writes the CycloneDX SBOM (JSON) of the image built from
// binary and spec to w: the Go modules compiled into the binary, as
// cyclonedx-gomod reads them from its build information, and the CA bundle
// beside it. Its serial number and timestamp derive from the inputs, so the
// same inputs give the same bytes.
func WriteSBOM(w io.Writer, spec Spec, binary, caVersion string) error {
	g, err := bin.NewGenerator(binary, bin.WithVersionOverride(spec.Version), bin.WithIncludeStdlib(true), bin.WithLogger(zerolog.Nop()))
	if err != nil {
		return fmt.Errorf("sbom: %w", err)
	}
	bom, err := g.Generate()
	if err != nil {
		return fmt.Errorf("sbom of %s: %w", binary, err)
	}
	ca, err := os.ReadFile(spec.CABundle)
	if err != nil {
		return fmt.Errorf("sbom: %w", err)
	}
	caSum := sha256.Sum256(ca)
	comps := append(*bom.Components, cdx.Component{
		BOMRef: "ca-certificates", Type: cdx.ComponentTypeData, Name: "ca-certificates", Version: caVersion,
		Description: "CA certificates at " + caPath + ", the build machine's Debian bundle",
		Hashes:      &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: hex.EncodeToString(caSum[:])}},
	})
	bom.Components = &comps
	binSum, err := fileSHA256(binary)
	if err != nil {
		return fmt.Errorf("sbom: %w", err)
	}
	bom.SerialNumber = uuid.NewSHA1(uuid.NameSpaceURL, []byte("kubetask-image-sbom:"+binSum+":"+hex.EncodeToString(caSum[:]))).URN()
	bom.Metadata.Timestamp = spec.Created.UTC().Format(time.RFC3339)
	enc := cdx.NewBOMEncoder(w, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	if err := enc.Encode(bom); err != nil {
		return fmt.Errorf("sbom: %w", err)
	}
	return nil
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
