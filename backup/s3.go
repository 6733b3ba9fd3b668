package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// s3Store is a location under a prefix of an S3 bucket, on AWS or any
// S3-compatible server. Objects are written whole by PutObject (large ones
// as multipart uploads, aborted on error), so none is ever seen part
// written; create uses a conditional write (If-None-Match: *), which the
// server must support for the location's lock to exclude a second writer.
type s3Store struct {
	url    string // as Open accepts it: s3://bucket/prefix/[?endpoint=...&region=...]
	base   string // s3://bucket/prefix/
	bucket string
	prefix string // "" or ending in "/"
	cl     *minio.Client
	creds  *credentials.Credentials
	tr     *http.Transport // cl's own; close ends its idle connections
}

// S3 location parameters, from the location's URL query or the
// environment. Credentials come only from the environment (or the AWS
// credentials file, or the instance's IAM role), never from the URL, so
// they are not written into logs and shell histories.
const (
	s3EndpointParam = "endpoint"
	s3RegionParam   = "region"
)

// openS3 opens the location at u, an s3:// URL:
//
//	s3://BUCKET[/PREFIX][?endpoint=URL][&region=REGION]
//
// endpoint defaults to $AWS_ENDPOINT_URL_S3, then $AWS_ENDPOINT_URL, then
// AWS (https://s3.amazonaws.com); an endpoint without a scheme is reached
// over HTTPS, and a custom endpoint with path-style requests. region
// defaults to $AWS_REGION, then $AWS_DEFAULT_REGION, then what the server
// says. The bucket must exist. Credentials come from creds when it is set,
// else from the environment, the AWS credentials file or the instance's
// role.
func openS3(ctx context.Context, raw string, u *url.URL, creds *S3Credentials) (*s3Store, error) {
	bucket := u.Host
	if bucket == "" {
		return nil, fmt.Errorf("backup: location %s: no bucket (want s3://BUCKET/PREFIX)", raw)
	}
	if u.User != nil {
		return nil, fmt.Errorf("backup: location %s: credentials do not go in the URL; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", u.Redacted())
	}
	q := u.Query()
	for k := range q {
		if k != s3EndpointParam && k != s3RegionParam {
			return nil, fmt.Errorf("backup: location %s: unknown parameter %q (known: %s, %s)", raw, k, s3EndpointParam, s3RegionParam)
		}
	}
	endpoint := firstSet(q.Get(s3EndpointParam), os.Getenv("AWS_ENDPOINT_URL_S3"), os.Getenv("AWS_ENDPOINT_URL"))
	custom := endpoint != ""
	if !custom {
		endpoint = "https://s3.amazonaws.com"
	}
	if !strings.Contains(endpoint, "://") {
		endpoint = "https://" + endpoint
	}
	eu, err := url.Parse(endpoint)
	if err != nil || eu.Host == "" || (eu.Scheme != "http" && eu.Scheme != "https") || (eu.Path != "" && eu.Path != "/") {
		return nil, fmt.Errorf("backup: location %s: bad endpoint %q (want http(s)://HOST[:PORT])", raw, endpoint)
	}
	lookup := minio.BucketLookupAuto
	if custom {
		lookup = minio.BucketLookupPath
	}
	chain := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{},
		&credentials.IAM{Client: &http.Client{Transport: http.DefaultTransport}},
	})
	if creds != nil {
		chain = credentials.NewStaticV4(creds.AccessKeyID, creds.SecretAccessKey, creds.SessionToken)
	}
	tr, err := minio.DefaultTransport(eu.Scheme == "https")
	if err != nil {
		return nil, fmt.Errorf("backup: location %s: %w", raw, err)
	}
	cl, err := minio.New(eu.Host, &minio.Options{
		Transport:    tr,
		Creds:        chain,
		Secure:       eu.Scheme == "https",
		Region:       firstSet(q.Get(s3RegionParam), os.Getenv("AWS_REGION"), os.Getenv("AWS_DEFAULT_REGION")),
		BucketLookup: lookup,
		// Each object and part carries its CRC-32C (x-amz-checksum-crc32c,
		// sent after the body), which the server checks before it stores
		// anything: see put.
		TrailingHeaders: true,
	})
	if err != nil {
		return nil, fmt.Errorf("backup: location %s: %w", raw, err)
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		if err := validObjectName(prefix); err != nil {
			return nil, fmt.Errorf("backup: location %s: bad prefix: %w", raw, err)
		}
		prefix += "/"
	}
	base := "s3://" + bucket + "/" + prefix
	s := &s3Store{url: base, base: base, bucket: bucket, prefix: prefix, cl: cl, creds: chain, tr: tr}
	// The endpoint and region given in the URL stay in it (they are no
	// secret), so that String is a location Open reaches again.
	keep := url.Values{}
	for _, k := range []string{s3EndpointParam, s3RegionParam} {
		if v := q.Get(k); v != "" {
			keep.Set(k, v)
		}
	}
	if len(keep) > 0 {
		s.url += "?" + keep.Encode()
	}
	ok, err := cl.BucketExists(ctx, bucket)
	if err != nil {
		s.close()
		return nil, fmt.Errorf("backup: location %s: %w", s.base, s3Error(err))
	}
	if !ok {
		s.close()
		return nil, fmt.Errorf("backup: location %s: no bucket %q at %s; create it first", s.base, bucket, eu.Host)
	}
	return s, nil
}

// close ends the connections the store's client keeps open between
// requests; requests made after it open new ones.
func (s *s3Store) close() { s.tr.CloseIdleConnections() }

func firstSet(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

func (s *s3Store) String() string { return s.url }

func (s *s3Store) where(name string) string { return s.base + name }

func (s *s3Store) key(name string) (string, error) {
	if err := validObjectName(name); err != nil {
		return "", err
	}
	return s.prefix + name, nil
}

func (s *s3Store) create(ctx context.Context, name string, b []byte) error {
	key, err := s.key(name)
	if err != nil {
		return err
	}
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream"}
	opts.SetMatchETagExcept("*")
	_, err = s.cl.PutObject(ctx, s.bucket, key, bytes.NewReader(b), int64(len(b)), opts)
	if err != nil {
		if r := minio.ToErrorResponse(err); r.StatusCode == http.StatusPreconditionFailed || r.Code == "PreconditionFailed" {
			return fmt.Errorf("%s: %w", key, fs.ErrExist)
		}
		return s3Error(err)
	}
	return nil
}

// Objects larger than s3PartSize are written as multipart uploads whose
// parts go up s3UploadParts at once: the parts are read from the stream in
// order into that many buffers, and each is sent as soon as it is full, so
// one file's upload no longer waits for each part's round trip before
// reading the next. That holds s3UploadParts × s3PartSize bytes per file
// being written (64 MiB; a backup writes CreateOptions.Parallel files at
// once). Smaller objects are one PutObject.
const (
	s3PartSize    = 16 << 20
	s3UploadParts = 4
)

// put sends the body unsigned (UNSIGNED-PAYLOAD, as the AWS SDKs do over
// HTTPS) with its CRC-32C in a trailer, which the server checks: the
// signature covers the request's headers (who writes, where), not the
// body's bytes. Over HTTPS, TLS protects the body. Over plain HTTP,
// nothing does against someone on the path who rewrites both the body and
// its checksum (a signed body would be refused); the checksum and the
// backup's own (every stored file is named by its CRC-32C, which verify
// and restore check) catch accidental damage only, and over plain HTTP a
// restore's downloads are unauthenticated anyway. Signing the body cost a SHA-256
// pass on each side (docs/backup-and-watch.md, "S3 bodies unsigned").
func (s *s3Store) put(ctx context.Context, name string, r io.Reader, size int64) error {
	key, err := s.key(name)
	if err != nil {
		return err
	}
	opts := minio.PutObjectOptions{ContentType: "application/octet-stream", PartSize: s3PartSize,
		DisableContentSha256: true, Checksum: minio.ChecksumCRC32C}
	if size > s3PartSize {
		opts.ConcurrentStreamParts, opts.NumThreads = true, s3UploadParts
	}
	_, err = s.cl.PutObject(ctx, s.bucket, key, r, size, opts)
	return s3Error(err)
}

func (s *s3Store) tempFile() (*os.File, error) { return os.CreateTemp("", "shale-backup-*") }

func (s *s3Store) putFile(ctx context.Context, name string, f *os.File, size int64) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return s.put(ctx, name, f, size)
}

func (s *s3Store) open(ctx context.Context, name string) (io.ReadCloser, error) {
	key, err := s.key(name)
	if err != nil {
		return nil, err
	}
	obj, err := s.cl.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s3Error(err)
	}
	// GetObject sends nothing until the first read; Stat makes a missing
	// object an error here.
	if _, err := obj.Stat(); err != nil {
		_ = obj.Close()
		return nil, s3Error(err)
	}
	return obj, nil
}

func (s *s3Store) list(ctx context.Context, prefix string) ([]object, error) {
	var out []object
	for o := range s.cl.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, s3Error(o.Err)
		}
		name := strings.TrimPrefix(o.Key, s.prefix)
		if isTemp(name[strings.LastIndexByte(name, '/')+1:]) {
			continue
		}
		out = append(out, object{name: name, size: o.Size})
	}
	return out, nil
}

func (s *s3Store) clean(ctx context.Context) error {
	for u := range s.cl.ListIncompleteUploads(ctx, s.bucket, s.prefix, true) {
		if u.Err != nil {
			return s3Error(u.Err)
		}
		if err := s.cl.RemoveIncompleteUpload(ctx, s.bucket, u.Key); err != nil {
			return fmt.Errorf("abort the incomplete upload of %s: %w", s.base+strings.TrimPrefix(u.Key, s.prefix), s3Error(err))
		}
	}
	return nil
}

func (s *s3Store) remove(ctx context.Context, name string) error {
	key, err := s.key(name)
	if err != nil {
		return err
	}
	err = s.cl.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{})
	if err != nil && errors.Is(s3Error(err), fs.ErrNotExist) {
		return nil
	}
	return s3Error(err)
}

// s3Error makes a missing object or bucket an error wrapping
// fs.ErrNotExist, and says what the server answered.
func s3Error(err error) error {
	if err == nil {
		return nil
	}
	r := minio.ToErrorResponse(err)
	switch {
	case r.Code == "NoSuchKey" || r.Code == "NoSuchBucket" || r.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%w: %v", fs.ErrNotExist, err)
	case r.Code != "":
		return fmt.Errorf("s3: %s (%d %s): %w", r.Message, r.StatusCode, r.Code, err)
	}
	return err
}
