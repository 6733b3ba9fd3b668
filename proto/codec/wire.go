package codec

import (
	"errors"
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

var (
	errInvalidWire = errors.New("proto: cannot parse invalid wire-format data")
	errInvalidUTF8 = errors.New("proto: string field contains invalid UTF-8")
	errTooDeep     = errors.New("proto: exceeded maximum recursion depth")
)

// maxDepth is how deeply messages may nest, protobuf's default
// (proto.UnmarshalOptions.RecursionLimit).
const maxDepth = 10000

// checkWire reports what proto.Unmarshal would refuse in b, an encoding
// of m's type, and the generated UnmarshalVT lets through: a field number
// out of range, a malformed field that no known field parses (an unknown
// field, kept as bytes: a 10-byte varint of more than 64 bits, a group
// whose end does not match its start), and a proto3 string that is not
// valid UTF-8. The check goes over the bytes once, without allocating,
// and descends into the fields whose type is a message; it is what keeps
// a node from taking in (and replicating to nodes that decode with
// protobuf) what protobuf refuses, or a string that proto.Marshal refuses
// to write back. UnmarshalVT checks the rest: the lengths and the wire
// type of every known field.
func checkWire(b []byte, m proto.Message) error {
	return planOf(m.ProtoReflect().Descriptor()).check(b, 0)
}

// A wirePlan is what checkWire needs of one message type: its fields
// that are strings to check or messages to descend into.
type wirePlan struct {
	// byNumber[n] is field n; numbers at or past its length are in
	// large.
	byNumber []wireField
	large    map[protowire.Number]wireField
}

type wireField struct {
	utf8 bool      // a string whose UTF-8 protobuf checks
	msg  *wirePlan // a message (a map's entry, too)
}

func (p *wirePlan) field(n protowire.Number) wireField {
	if int(n) < len(p.byNumber) {
		return p.byNumber[n]
	}
	return p.large[n]
}

// check checks b, an encoding of p's message type nested depth deep.
func (p *wirePlan) check(b []byte, depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber { // ConsumeTag checks the lower bound only
			return errInvalidWire
		}
		b = b[n:]
		if typ == protowire.BytesType {
			if f := p.field(num); f.utf8 || f.msg != nil {
				v, n := protowire.ConsumeBytes(b)
				if n < 0 {
					return errInvalidWire
				}
				b = b[n:]
				if f.utf8 && !utf8.Valid(v) {
					return errInvalidUTF8
				}
				if f.msg != nil {
					if err := f.msg.check(v, depth+1); err != nil {
						return err
					}
				}
				continue
			}
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return errInvalidWire
		}
		b = b[n:]
	}
	return nil
}

// plans caches each message type's plan, by full name.
var plans sync.Map

// planOf returns the plan of message type md, building (and caching) it
// the first time.
func planOf(md protoreflect.MessageDescriptor) *wirePlan {
	if p, ok := plans.Load(md.FullName()); ok {
		return p.(*wirePlan)
	}
	p := buildPlan(md, map[protoreflect.FullName]*wirePlan{})
	plans.Store(md.FullName(), p)
	return p
}

// buildPlan builds md's plan; seen holds the plans built, or being built,
// in this call, so that a recursive type refers to its own plan (complete
// before it is used).
func buildPlan(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]*wirePlan) *wirePlan {
	if p, ok := seen[md.FullName()]; ok {
		return p
	}
	p := &wirePlan{}
	seen[md.FullName()] = p
	fds := md.Fields()
	for i := range fds.Len() {
		fd := fds.Get(i)
		var f wireField
		switch {
		case fd.Message() != nil: // a map's entry too
			f.msg = buildPlan(fd.Message(), seen)
		case fd.Kind() == protoreflect.StringKind:
			f.utf8 = checksUTF8(fd)
		}
		if !f.utf8 && f.msg == nil {
			continue
		}
		if n := fd.Number(); n < 1024 {
			if int(n) >= len(p.byNumber) {
				p.byNumber = append(p.byNumber, make([]wireField, int(n)+1-len(p.byNumber))...)
			}
			p.byNumber[n] = f
		} else {
			if p.large == nil {
				p.large = map[protowire.Number]wireField{}
			}
			p.large[n] = f
		}
	}
	return p
}

// checksUTF8 reports whether protobuf checks the UTF-8 of string field fd:
// proto3's, or one whose edition feature asks for it.
func checksUTF8(fd protoreflect.FieldDescriptor) bool {
	if fd.Syntax() == protoreflect.Editions {
		if e, ok := fd.(interface{ EnforceUTF8() bool }); ok {
			return e.EnforceUTF8()
		}
	}
	return fd.Syntax() == protoreflect.Proto3
}
