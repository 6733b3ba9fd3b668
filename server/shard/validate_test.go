package shard

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

func TestCheckTxn(t *testing.T) {
	lim := Limits{MaxKeyBytes: 4, MaxValueBytes: 3, MaxOps: 3, MaxBytes: 64}
	ops := func(o ...*shalev1.RequestOp) *shalev1.TxnRequest { return &shalev1.TxnRequest{Success: o} }
	for _, tc := range []struct {
		name string
		txn  *shalev1.TxnRequest
		req  Request
		want string // "" for valid; else a substring of the message
	}{
		{"valid put", ops(putOp("a", "v", 0, false)), RequestSingle, ""},
		{"valid txn", &shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("a")}}, Success: []*shalev1.RequestOp{getOp("a")}, Failure: []*shalev1.RequestOp{delRangeOp("a", "")}}, RequestTxn, ""},
		{"empty", &shalev1.TxnRequest{}, RequestTxn, "txn has no operations"},
		{"empty batch", &shalev1.TxnRequest{}, RequestBatch, "batch has no operations"},
		{"too many ops", ops(putOp("a", "", 0, false), putOp("b", "", 0, false), putOp("c", "", 0, false), putOp("d", "", 0, false)), RequestBatch, "batch has 4 compares and operations, limit 3"},
		{"too many bytes", &shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("a"), Value: make([]byte, 64)}}}, RequestTxn, "limit 64"},
		{"empty key, single", ops(putOp("", "v", 0, false)), RequestSingle, "key is empty"},
		{"empty key, batch names the op", ops(putOp("a", "v", 0, false), delOp("", false)), RequestBatch, "op 1: key is empty"},
		{"failure branch named", &shalev1.TxnRequest{Failure: []*shalev1.RequestOp{getOp("")}}, RequestTxn, "failure op 0: key is empty"},
		{"key over limit", ops(putOp("abcde", "v", 0, false)), RequestSingle, "key is 5 bytes, limit 4"},
		{"value over limit", ops(putOp("a", "abcd", 0, false)), RequestSingle, "value is 4 bytes, limit 3"},
		{"negative ttl", ops(putOp("a", "v", -1, false)), RequestSingle, "ttl_ms is negative"},
		{"empty op", ops(&shalev1.RequestOp{}), RequestTxn, "op 0: the operation is empty"},
		{"get in a batch", ops(putOp("a", "v", 0, false), getOp("b")), RequestBatch, "holds only writes"},
		{"range empty start", ops(delRangeOp("", "b")), RequestSingle, "start_key is empty"},
		{"range empty", ops(delRangeOp("b", "b")), RequestSingle, "empty or inverted"},
		{"range inverted", ops(delRangeOp("c", "b")), RequestSingle, "empty or inverted"},
		{"range bound over limit", ops(delRangeOp("a", "zzzzz")), RequestSingle, "bound over 4 bytes"},
		{"compare empty key", &shalev1.TxnRequest{Compares: []*shalev1.Compare{{}}}, RequestTxn, "compare 0: key is empty"},
		{"compare target", &shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("a"), Target: 99}}}, RequestTxn, "unknown compare target 99"},
		{"compare result", &shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("a"), Result: 99}}}, RequestTxn, "unknown compare result 99"},
	} {
		inv := CheckTxn(tc.txn, lim, tc.req)
		switch {
		case tc.want == "" && inv != nil:
			t.Errorf("%s: %v, want valid", tc.name, inv)
		case tc.want != "" && inv == nil:
			t.Errorf("%s: valid, want %q", tc.name, tc.want)
		case tc.want != "" && (inv.Code != codes.InvalidArgument || !strings.Contains(inv.Message, tc.want)):
			t.Errorf("%s: %v %q, want InvalidArgument %q", tc.name, inv.Code, inv.Message, tc.want)
		}
	}
	// No limits: only the rules that do not depend on a node's configuration.
	if inv := CheckTxn(&shalev1.TxnRequest{Success: []*shalev1.RequestOp{putOp(strings.Repeat("k", 1<<16), strings.Repeat("v", 1<<22), 0, false)}}, Limits{}, RequestTxn); inv != nil {
		t.Errorf("no limits: %v", inv)
	}
}

func TestTxnInShard(t *testing.T) {
	desc := userDesc(1, "b", "m")
	ops := func(o ...*shalev1.RequestOp) *shalev1.TxnRequest { return &shalev1.TxnRequest{Success: o} }
	for _, tc := range []struct {
		name     string
		txn      *shalev1.TxnRequest
		boundary string // "" for inside
	}{
		{"inside", ops(putOp("b", "v", 0, false), delOp("l", false), delRangeOp("c", "m"), delRangeOp("c", "")), ""},
		{"below", ops(putOp("c", "v", 0, false), putOp("a", "v", 0, false)), "b"},
		{"at end", ops(getOp("m")), "m"},
		{"compare above", &shalev1.TxnRequest{Compares: []*shalev1.Compare{{Key: []byte("z")}}}, "m"},
		{"failure branch", &shalev1.TxnRequest{Success: []*shalev1.RequestOp{getOp("c")}, Failure: []*shalev1.RequestOp{delOp("a", false)}}, "b"},
		{"range from below", ops(delRangeOp("a", "c")), "b"},
		{"range past end", ops(delRangeOp("c", "n")), "m"},
		{"range in next shard", ops(delRangeOp("n", "z")), "m"},
	} {
		inv := TxnInShard(tc.txn, desc)
		switch {
		case tc.boundary == "" && inv != nil:
			t.Errorf("%s: %v, want inside", tc.name, inv)
		case tc.boundary != "" && inv == nil:
			t.Errorf("%s: inside, want outside past %q", tc.name, tc.boundary)
		case tc.boundary != "" && (inv.Code != codes.OutOfRange || string(inv.Boundary) != tc.boundary):
			t.Errorf("%s: %v boundary %q, want OutOfRange past %q", tc.name, inv.Code, inv.Boundary, tc.boundary)
		}
	}
	if inv := KeysInShard([][]byte{[]byte("c"), []byte("m")}, desc); inv == nil || string(inv.Boundary) != "m" {
		t.Errorf("KeysInShard: %v", inv)
	}
}
