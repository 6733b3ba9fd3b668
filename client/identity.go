package client

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	shalev1 "github.com/shale-db/shale/proto/shale/v1"
)

// retireAfter is how long a connection that reached the wrong node stays
// open for the calls already on it (each is refused at once) before it is
// closed.
const retireAfter = 30 * time.Second

// toNode marks ctx's calls as meant for node id: a node with another ID
// refuses them (see shalev1.TargetNodeMetadataKey).
func toNode(ctx context.Context, id uint64) context.Context {
	if id == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, shalev1.TargetNodeMetadataKey, strconv.FormatUint(id, 10))
}

// nodeConn is a connection whose calls are all meant for node id.
type nodeConn struct {
	cc *grpc.ClientConn
	id uint64
}

func (n nodeConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return n.cc.Invoke(toNode(ctx, n.id), method, args, reply, opts...)
}

func (n nodeConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return n.cc.NewStream(toNode(ctx, n.id), desc, method, opts...)
}

// isWrongNode reports whether err is a node's refusal of a call meant for
// another node.
func isWrongNode(err error) bool {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return false
	}
	for _, x := range st.Details() {
		if v, ok := x.(*errdetails.ErrorInfo); ok && v.GetDomain() == shalev1.ErrorDomain && v.GetReason() == shalev1.ReasonWrongNode {
			return true
		}
	}
	return false
}

// wrongNodeInterceptors watch the calls on the connection to addr (held in
// *cc once dialed): one refused as meant for another node retires the
// connection, so that the next call dials addr again and reaches the node
// that has it now.
func (c *Client) wrongNodeInterceptors(addr string, cc **grpc.ClientConn) []grpc.DialOption {
	check := func(err error) { c.retireWrongNode(addr, *cc, err) }
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, conn *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, conn, opts...)
			check(err)
			return err
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, conn *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s, err := streamer(ctx, desc, conn, method, opts...)
			if err != nil {
				check(err)
				return nil, err
			}
			return &checkedStream{ClientStream: s, check: check}, nil
		}),
	}
}

// checkedStream passes a stream's receive errors to check.
type checkedStream struct {
	grpc.ClientStream
	check   func(error)
	checked bool
}

func (s *checkedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil && !s.checked {
		s.checked = true
		s.check(err)
	}
	return err
}

// retireWrongNode retires cc (see retire) when err is a node's refusal of
// a call meant for another node; other errors leave it in use.
func (c *Client) retireWrongNode(addr string, cc *grpc.ClientConn, err error) {
	if err != nil && isWrongNode(err) {
		c.retire(addr, cc, err)
	}
}

// retire takes cc out of use for addr (if it still serves it) and closes it
// after retireAfter, or when the client closes.
func (c *Client) retire(addr string, cc *grpc.ClientConn, why error) {
	if cc == nil {
		return
	}
	c.mu.Lock()
	if c.closed || c.conns[addr] != cc {
		c.mu.Unlock()
		return
	}
	delete(c.conns, addr)
	mux := c.muxes[cc]
	delete(c.muxes, cc)
	c.retired[cc] = struct{}{}
	c.mu.Unlock()
	if mux != nil {
		// Its KV.Calls stream may be on a connection of its own.
		mux.close()
	}
	c.log.Info("shale client: the address reached another node; dialing it again", "address", addr, "err", why)
	time.AfterFunc(retireAfter, func() {
		c.mu.Lock()
		_, ok := c.retired[cc]
		delete(c.retired, cc)
		c.mu.Unlock()
		if ok {
			_ = cc.Close()
		}
	})
}
