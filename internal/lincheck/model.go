// Package lincheck records histories of key-value operations against a
// Shale cluster and checks them for linearizability with porcupine
// (github.com/anishathalye/porcupine).
//
// A test creates a Recorder, lets concurrent logical clients record their
// operations (Recorder.Call, then Op.Return, Op.Fail or Op.Unknown; Exec
// does this around the Go SDK's calls), takes the History and checks it with
// Check. The model is a register per key: porcupine partitions the history
// by key and checks every key on its own, with the key's current value (or
// its absence) as the state.
//
// Outcomes:
//
//   - known: the operation's result was observed (a read's value or absence,
//     a compare-and-swap that did or did not swap, a delete that did or did
//     not find the key); it must fit between its call and its return;
//   - failed: the operation definitely did not take effect (for example
//     InvalidArgument); it is left out of the history;
//   - unknown: the operation may or may not have taken effect (a timeout,
//     Unavailable, a connection lost while a write was in flight). An
//     unknown write stays in the history with its return moved to the end of
//     the history, after every other event, which is porcupine's way of
//     saying "took effect at any time after its call, or never" (taking
//     effect after everything else is the same as never); an unknown read
//     observed nothing and is left out.
//
// Each unknown write stays open to the end of its key's history, and
// porcupine's search grows with how many of them one key holds: a
// workload that runs long under faults should move to fresh keys every few
// hundred operations (the chaos workload's OpsPerKey), so that each key's
// history stays short.
//
// Writes should carry unique values (Recorder.NewValue) so that a read
// identifies the write it saw. Compare-and-swap expects a non-empty value or
// absence (Input.ExpectAbsent).
//
// On a violation (or a check that ran out of time) Check writes the history
// as JSON and porcupine's HTML visualisation, with the recorded annotations
// (fault injections, say) on its timeline, into a directory and returns
// their paths; ReadHistory loads such a history again to re-check it.
package lincheck

import (
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/anishathalye/porcupine"
)

// Kind is the kind of an operation.
type Kind uint8

// The operation kinds.
const (
	// KindGet reads the key.
	KindGet Kind = iota + 1
	// KindPut sets the key to Input.Value.
	KindPut
	// KindCAS sets the key to Input.Value if its value is Input.Expect (or
	// if it is absent, with Input.ExpectAbsent).
	KindCAS
	// KindDelete removes the key.
	KindDelete
)

// String returns "get", "put", "cas" or "delete".
func (k Kind) String() string {
	switch k {
	case KindGet:
		return "get"
	case KindPut:
		return "put"
	case KindCAS:
		return "cas"
	case KindDelete:
		return "delete"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// IsWrite reports whether operations of kind k may change the key.
func (k Kind) IsWrite() bool { return k == KindPut || k == KindCAS || k == KindDelete }

// Input is an operation as called.
type Input struct {
	// Kind is the operation.
	Kind Kind `json:"kind"`
	// Key is the key operated on.
	Key string `json:"key"`
	// Value is the value written by KindPut and KindCAS.
	Value string `json:"value,omitempty"`
	// Expect is the value KindCAS compares with (non-empty).
	Expect string `json:"expect,omitempty"`
	// ExpectAbsent makes KindCAS compare with absence instead of Expect.
	ExpectAbsent bool `json:"expectAbsent,omitempty"`
}

// Output is the observed result of an operation.
type Output struct {
	// Unknown says the outcome is unknown: the operation (a write) may or
	// may not have taken effect, and the other fields mean nothing.
	Unknown bool `json:"unknown,omitempty"`
	// Found says the key was present: for KindGet when read, for KindCAS
	// just before the operation (Value is then its value).
	Found bool `json:"found,omitempty"`
	// Value is the value read by KindGet, or the value before KindCAS.
	Value string `json:"value,omitempty"`
	// Swapped says KindCAS swapped.
	Swapped bool `json:"swapped,omitempty"`
	// Deleted says KindDelete found the key.
	Deleted bool `json:"deleted,omitempty"`
}

// State is the model's state of one key.
type State struct {
	// Present says the key exists.
	Present bool
	// Value is its value when present.
	Value string
}

// String returns the quoted value, or "absent".
func (s State) String() string {
	if !s.Present {
		return "absent"
	}
	return strconv.Quote(s.Value)
}

// casMatches reports whether a compare-and-swap's comparison holds in s.
func casMatches(s State, in Input) bool {
	if in.ExpectAbsent {
		return !s.Present
	}
	return s.Present && s.Value == in.Expect
}

// Step is the sequential specification of one key: whether the operation
// (in, out) may take effect in state s, and the state after it.
func Step(s State, in Input, out Output) (bool, State) {
	switch in.Kind {
	case KindGet:
		if out.Unknown {
			return true, s // observed nothing
		}
		return out.Found == s.Present && (!out.Found || out.Value == s.Value), s
	case KindPut:
		return true, State{Present: true, Value: in.Value}
	case KindCAS:
		match := casMatches(s, in)
		if out.Unknown {
			if match {
				return true, State{Present: true, Value: in.Value}
			}
			return true, s
		}
		if out.Swapped != match || out.Found != s.Present || (out.Found && out.Value != s.Value) {
			return false, s
		}
		if match {
			return true, State{Present: true, Value: in.Value}
		}
		return true, s
	case KindDelete:
		if !out.Unknown && out.Deleted != s.Present {
			return false, s
		}
		return true, State{}
	}
	return false, s
}

// Describe renders an operation for the visualisation, e.g.
// `put("k1", "v3")`, `get("k1") → "v3"`, `cas("k1", "v3"→"v4") → swapped`.
func Describe(in Input, out Output) string {
	var call string
	switch in.Kind {
	case KindGet:
		call = fmt.Sprintf("get(%q)", in.Key)
	case KindPut:
		call = fmt.Sprintf("put(%q, %q)", in.Key, in.Value)
	case KindCAS:
		exp := strconv.Quote(in.Expect)
		if in.ExpectAbsent {
			exp = "absent"
		}
		call = fmt.Sprintf("cas(%q, %s→%q)", in.Key, exp, in.Value)
	case KindDelete:
		call = fmt.Sprintf("delete(%q)", in.Key)
	default:
		call = fmt.Sprintf("%v(%q)", in.Kind, in.Key)
	}
	if out.Unknown {
		return call + " → ?"
	}
	switch in.Kind {
	case KindGet:
		if !out.Found {
			return call + " → absent"
		}
		return call + " → " + strconv.Quote(out.Value)
	case KindCAS:
		cur := "absent"
		if out.Found {
			cur = strconv.Quote(out.Value)
		}
		if out.Swapped {
			return call + " → swapped (was " + cur + ")"
		}
		return call + " → not swapped (is " + cur + ")"
	case KindDelete:
		if out.Deleted {
			return call + " → deleted"
		}
		return call + " → absent"
	}
	return call
}

// Model returns the porcupine model of a key-value store: one register per
// key (the history is partitioned by key), Step as its specification.
// Inputs and outputs are Input and Output values, states State values.
func Model() porcupine.Model {
	return porcupine.Model{
		Partition: partitionByKey,
		Init:      func() interface{} { return State{} },
		Step: func(state, input, output interface{}) (bool, interface{}) {
			return Step(state.(State), input.(Input), output.(Output))
		},
		Equal: func(a, b interface{}) bool { return a.(State) == b.(State) },
		Hash: func(state interface{}) uint64 {
			s := state.(State)
			if !s.Present {
				return 0
			}
			h := fnv.New64a()
			_, _ = h.Write([]byte(s.Value))
			return h.Sum64() | 1
		},
		DescribeOperation: func(input, output interface{}) string {
			return Describe(input.(Input), output.(Output))
		},
		DescribeState: func(state interface{}) string { return state.(State).String() },
		DescribeOperationMetadata: func(info interface{}) string {
			if info == nil {
				return ""
			}
			return fmt.Sprint(info)
		},
	}
}

// partitionByKey splits a history into one sub-history per key, in the
// order keys first appear.
func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	index := map[string]int{}
	var out [][]porcupine.Operation
	for _, op := range history {
		k := op.Input.(Input).Key
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], op)
	}
	return out
}
