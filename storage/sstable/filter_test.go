package sstable

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/shale-db/shale/storage/internal/base"
)

func prefixKVs(n int) []kv {
	var kvs []kv
	for i := 0; i < n; i++ {
		// Prefix "tNNN|": 10 keys per prefix.
		k := fmt.Sprintf("t%04d|row%03d", i/10, i%10)
		kvs = append(kvs, kv{base.MakeInternalKey([]byte(k), base.SeqNum(i+1), base.KindSet), []byte("v")})
	}
	return kvs
}

func prefix5(k []byte) []byte {
	if i := bytes.IndexByte(k, '|'); i >= 0 {
		return k[:i+1]
	}
	return nil
}

func TestFilterWholeKey(t *testing.T) {
	kvs := prefixKVs(5000)
	data, _ := build(t, DefaultWriterOptions(), kvs, nil)
	r := open(t, data, ReaderOptions{})
	for _, e := range kvs {
		if !r.MayContain(e.key.UserKey) {
			t.Fatalf("false negative %s", e.key)
		}
	}
	fp := 0
	for i := 0; i < 10000; i++ {
		if r.MayContain([]byte(fmt.Sprintf("absent-%d", i))) {
			fp++
		}
	}
	if fp > 200 {
		t.Fatalf("%d/10000 false positives", fp)
	}
	// No prefix filter in this file.
	if !r.MayContainPrefix([]byte("zzz|")) {
		t.Fatal("MayContainPrefix without a prefix filter must be true")
	}
	// Filter disabled.
	opts := DefaultWriterOptions()
	opts.FilterBitsPerKey = 0
	data, md := build(t, opts, kvs, nil)
	if md.Properties.FilterSize != 0 || md.Properties.FilterPolicyName != "" {
		t.Fatal("filter written with 0 bits/key")
	}
	r = open(t, data, ReaderOptions{})
	if !r.MayContain([]byte("absent")) {
		t.Fatal("no filter must answer true")
	}
}

func TestFilterPrefix(t *testing.T) {
	kvs := prefixKVs(5000)
	no := false
	for _, whole := range []*bool{nil, &no} {
		opts := DefaultWriterOptions()
		opts.PrefixExtractor = prefix5
		opts.PrefixExtractorName = "upto-bar"
		opts.WholeKeyFiltering = whole
		data, md := build(t, opts, kvs, nil)
		if md.Properties.WholeKeyFiltering != (whole == nil) {
			t.Fatal("whole key filtering property")
		}
		r := open(t, data, ReaderOptions{PrefixExtractor: prefix5, PrefixExtractorName: "upto-bar"})
		for _, e := range kvs {
			if !r.MayContainPrefix(prefix5(e.key.UserKey)) || !r.MayContain(e.key.UserKey) {
				t.Fatalf("false negative %s", e.key)
			}
		}
		fp := 0
		for i := 0; i < 10000; i++ {
			if r.MayContainPrefix([]byte(fmt.Sprintf("u%04d|", i))) {
				fp++
			}
		}
		if fp > 200 {
			t.Fatalf("%d/10000 prefix false positives", fp)
		}
		if whole != nil {
			// Without whole keys, MayContain goes through the prefix.
			fp = 0
			for i := 0; i < 10000; i++ {
				if r.MayContain([]byte(fmt.Sprintf("u%04d|row001", i))) {
					fp++
				}
			}
			if fp > 200 {
				t.Fatalf("%d/10000 false positives via prefix", fp)
			}
		}
		// A reader with a different extractor must not trust the filter.
		r2 := open(t, data, ReaderOptions{PrefixExtractor: prefix5, PrefixExtractorName: "other"})
		if !r2.MayContainPrefix([]byte("u0001|")) {
			t.Fatal("mismatched extractor used")
		}
	}
}
