package storage

import (
	"fmt"
	"testing"

	"github.com/shale-db/shale/storage/vfs"
)

func TestSmoke(t *testing.T) {
	fs := vfs.NewMem()
	opts := &Options{FS: fs, MemTableSize: 256 << 10}
	d, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20000; i++ {
		if err := d.Set([]byte(fmt.Sprintf("key%06d", i)), []byte(fmt.Sprintf("val%d", i)), NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.DeleteRange([]byte("key000100"), []byte("key000200"), NoSync); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := d.CompactRange(nil, nil); err != nil {
		t.Fatal(err)
	}
	v, err := d.Get([]byte("key000050"))
	if err != nil || string(v) != "val50" {
		t.Fatalf("get: %q %v", v, err)
	}
	if _, err := d.Get([]byte("key000150")); err != ErrNotFound {
		t.Fatalf("deleted: %v", err)
	}
	it, _ := d.NewIter(nil)
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	it.Close()
	if n != 19900 {
		t.Fatalf("n=%d", n)
	}
	t.Log(d.Metrics())
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d, err = Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	v, err = d.Get([]byte("key019999"))
	if err != nil || string(v) != "val19999" {
		t.Fatalf("get after reopen: %q %v", v, err)
	}
	d.Close()
}
