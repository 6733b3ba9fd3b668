package output

import (
	"bytes"
	"testing"
)

func TestCodec(t *testing.T) {
	for _, c := range []struct {
		codec Codec
		in    string
		bytes []byte
		out   string
	}{
		{Codec{}, "user/42", []byte("user/42"), "user/42"},
		{Codec{}, "", []byte{}, ""},
		{Codec{}, "a\x00b", []byte("a\x00b"), `"a\x00b"`},
		{Codec{}, "é", []byte("é"), `"\u00e9"`},
		{Codec{Hex: true}, "0x00ff", []byte{0, 0xff}, "0x00ff"},
		{Codec{Hex: true}, "00FF", []byte{0, 0xff}, "0x00ff"},
		{Codec{Hex: true}, "", []byte{}, "0x"},
	} {
		b, err := c.codec.Parse(c.in)
		if err != nil || !bytes.Equal(b, c.bytes) {
			t.Errorf("%+v.Parse(%q) = %q, %v; want %q", c.codec, c.in, b, err, c.bytes)
		}
		if got := c.codec.Format(c.bytes); got != c.out {
			t.Errorf("%+v.Format(%q) = %q, want %q", c.codec, c.bytes, got, c.out)
		}
	}
	if _, err := (Codec{Hex: true}).Parse("0xzz"); err == nil {
		t.Error("Parse accepted invalid hex")
	}
	if b, err := (Codec{}).ParseOptional(""); b != nil || err != nil {
		t.Errorf("ParseOptional(\"\") = %q, %v; want nil", b, err)
	}
}

func TestFormatTruncated(t *testing.T) {
	c := Codec{}
	if got := c.FormatTruncated([]byte("abcdef"), 4); got != "abcd...(6 bytes)" {
		t.Errorf("got %q", got)
	}
	if got := c.FormatTruncated([]byte("abcd"), 4); got != "abcd" {
		t.Errorf("got %q", got)
	}
	if got := c.FormatTruncated([]byte("abcdef"), 0); got != "abcdef" {
		t.Errorf("got %q", got)
	}
	if got := (Codec{Hex: true}).FormatTruncated([]byte{1, 2, 3}, 2); got != "0x0102...(3 bytes)" {
		t.Errorf("got %q", got)
	}
}

func TestParseFormatAndBytes(t *testing.T) {
	if f, err := ParseFormat("json"); f != JSON || err != nil {
		t.Errorf("ParseFormat(json) = %q, %v", f, err)
	}
	if _, err := ParseFormat("yaml"); err == nil {
		t.Error("ParseFormat accepted yaml")
	}
	for n, want := range map[uint64]string{0: "0B", 1023: "1023B", 1536: "1.5K", 3 << 20: "3.0M", 5 << 30: "5.0G"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
