// A grpc-go server for tonic-balancer's tests: the same service as the Python peer
// (../python/server.py), with no generated code (hand-written grpc.ServiceDesc over the
// well-known wrapper messages), so that no protoc is needed.
//
//	peer.Peer/Unary         BytesValue -> BytesValue      echoes the payload
//	peer.Peer/ServerStream  BytesValue -> stream          sends N messages (N = payload as a decimal, default 3)
//	peer.Peer/ClientStream  stream -> BytesValue          answers the number of messages read
//	peer.Peer/Bidi          stream -> stream              echoes each message
//	peer.Control/Set        StringValue -> StringValue    a command (see control below)
//	grpc.health.v1.Health                                 grpc-go's own health service
//
// The test's messages (fleet-proto/proto/peer.proto) are wire-compatible with the wrappers:
// field 1 is `bytes payload` / `string command`.
//
// Started by the Rust harness (fleet-service/src/peers.rs) on 127.0.0.1; it prints exactly one
// line "LISTENING <port>" to stdout once it serves, and exits when its stdin closes (the test
// process is gone, however it died), so that no peer outlives its test.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// mode is what the service does with each call; a control command sets it.
type mode struct {
	name  string        // "ok", "status", "panic", "panic-recovered", "hang"
	delay time.Duration // ok: the wait before the answer
	code  codes.Code    // status, panic-recovered: the code answered
	msg   string        // status: the message
}

// recoverable is the value a handler panics with in mode panic-recovered: the recovery
// interceptor turns it into a status. A plain panic (mode panic) is not recovered: grpc-go
// runs each handler in a goroutine of its own and does not recover panics, so the whole
// process dies, as a production server without a recovery middleware does.
type recoverable struct{ code codes.Code }

type server struct {
	mu       sync.Mutex
	current  mode
	counts   map[string]int64 // calls served, by the mode that answered them
	inflight atomic.Int64     // peer.Peer calls being handled now
	peak     atomic.Int64     // the most ever handled at once
	release  chan struct{}    // closed by `release`: hanging calls answer OK
	conns    atomic.Int64     // connections that carried a peer.Peer call (not the control's)
	health   *health.Server
	grpc     *grpc.Server
	stopped  chan struct{} // closed when a graceful stop is over
}

// parseMode reads "ok [delay=D]", "status CODE [msg...]", "panic", "panic-recovered [CODE]",
// "hang".
func parseMode(cmd string) (mode, error) {
	f := strings.Fields(cmd)
	if len(f) == 0 {
		return mode{}, fmt.Errorf("empty mode")
	}
	m := mode{name: f[0]}
	switch f[0] {
	case "ok":
		for _, a := range f[1:] {
			v, ok := strings.CutPrefix(a, "delay=")
			if !ok {
				return m, fmt.Errorf("ok: unknown option %q", a)
			}
			d, err := time.ParseDuration(v)
			if err != nil {
				return m, err
			}
			m.delay = d
		}
	case "status":
		if len(f) < 2 {
			return m, fmt.Errorf("status needs a code")
		}
		c, err := parseCode(f[1])
		if err != nil {
			return m, err
		}
		m.code = c
		m.msg = strings.Join(f[2:], " ")
		if m.msg == "" {
			m.msg = "peer: status " + c.String()
		}
	case "panic-recovered":
		m.code = codes.Unknown
		if len(f) > 1 {
			c, err := parseCode(f[1])
			if err != nil {
				return m, err
			}
			m.code = c
		}
	case "panic", "hang":
	default:
		return m, fmt.Errorf("unknown mode %q", f[0])
	}
	return m, nil
}

// parseCode reads a gRPC code by name (UNAVAILABLE, as the spec spells it) or number.
func parseCode(s string) (codes.Code, error) {
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n <= 16 {
		return codes.Code(n), nil
	}
	var c codes.Code
	// UnmarshalJSON takes the spec's upper-case names ("UNAVAILABLE").
	if err := c.UnmarshalJSON([]byte(strconv.Quote(strings.ToUpper(s)))); err != nil {
		return 0, fmt.Errorf("unknown code %q", s)
	}
	return c, nil
}

// begin counts a call in flight and returns the mode it gets: the payload's own when it starts
// with "!" (a one-call override, e.g. "!status INTERNAL"), else the current one.
func (s *server) begin(payload []byte) (mode, func(), error) {
	m := s.mode()
	if p, ok := strings.CutPrefix(string(payload), "!"); ok {
		o, err := parseMode(p)
		if err != nil {
			return m, func() {}, status.Error(codes.InvalidArgument, err.Error())
		}
		m = o
	}
	n := s.inflight.Add(1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	s.mu.Lock()
	s.counts[m.name]++
	s.mu.Unlock()
	return m, func() { s.inflight.Add(-1) }, nil
}

func (s *server) mode() mode {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

// apply does what the mode says before the answer: nil to answer normally.
func (s *server) apply(ctx context.Context, m mode) error {
	switch m.name {
	case "ok":
		if m.delay > 0 {
			select {
			case <-time.After(m.delay):
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			}
		}
		return nil
	case "status":
		if m.code == codes.OK {
			return nil
		}
		return status.Error(m.code, m.msg)
	case "panic":
		panic("peer: mode panic (not recovered: the process dies)")
	case "panic-recovered":
		panic(recoverable{m.code})
	case "hang":
		s.mu.Lock()
		release := s.release
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-release:
			return nil
		}
	}
	return status.Errorf(codes.Internal, "peer: mode %q", m.name)
}

func (s *server) unary(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
	m, done, err := s.begin(in.Value)
	defer done()
	if err != nil {
		return nil, err
	}
	if err := s.apply(ctx, m); err != nil {
		return nil, err
	}
	return in, nil
}

func (s *server) serverStream(in *wrapperspb.BytesValue, stream grpc.ServerStream) error {
	m, done, err := s.begin(nil)
	defer done()
	if err != nil {
		return err
	}
	if err := s.apply(stream.Context(), m); err != nil {
		return err
	}
	n := 3
	if len(in.Value) > 0 {
		if n, err = strconv.Atoi(string(in.Value)); err != nil {
			return status.Errorf(codes.InvalidArgument, "payload %q: not a count", in.Value)
		}
	}
	for i := range n {
		if err := stream.SendMsg(wrapperspb.Bytes([]byte(strconv.Itoa(i)))); err != nil {
			return err
		}
	}
	return nil
}

// clientStream reads the whole request stream before the mode applies, as servers that fail
// after the input do.
func (s *server) clientStream(stream grpc.ServerStream) error {
	m, done, err := s.begin(nil)
	defer done()
	if err != nil {
		return err
	}
	n := 0
	for {
		in := new(wrapperspb.BytesValue)
		if err := stream.RecvMsg(in); err == io.EOF {
			break
		} else if err != nil {
			return err
		}
		n++
	}
	if err := s.apply(stream.Context(), m); err != nil {
		return err
	}
	return stream.SendMsg(wrapperspb.Bytes([]byte(strconv.Itoa(n))))
}

// bidi applies the mode once, before the first echo.
func (s *server) bidi(stream grpc.ServerStream) error {
	m, done, err := s.begin(nil)
	defer done()
	if err != nil {
		return err
	}
	if err := s.apply(stream.Context(), m); err != nil {
		return err
	}
	for {
		in := new(wrapperspb.BytesValue)
		if err := stream.RecvMsg(in); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if err := stream.SendMsg(in); err != nil {
			return err
		}
	}
}

// control runs one command and answers a line of text:
//
//	ok [delay=D] | status CODE [msg] | panic | panic-recovered [CODE] | hang   set the mode
//	health SERVING|NOT_SERVING [service]   the health service's answer ("" = the server)
//	count      "total=N ok=N status=N ..." calls to peer.Peer by the mode that served them
//	inflight   "inflight=N peak=N"
//	conns      "conns=N": connections that carried a peer.Peer call
//	release    hanging calls answer OK (new ones hang again while the mode is hang)
//	graceful-stop [drain=D]   GracefulStop: GOAWAY on every connection, new connections
//	           refused; after D (default 100ms) hanging calls are released; exits when done
func (s *server) control(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	f := strings.Fields(in.Value)
	if len(f) == 0 {
		return nil, status.Error(codes.InvalidArgument, "empty command")
	}
	answer := "ok"
	switch f[0] {
	case "health":
		if len(f) < 2 {
			return nil, status.Error(codes.InvalidArgument, "health SERVING|NOT_SERVING [service]")
		}
		v, ok := healthpb.HealthCheckResponse_ServingStatus_value[f[1]]
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "unknown health status %q", f[1])
		}
		service := ""
		if len(f) > 2 {
			service = f[2]
		}
		s.health.SetServingStatus(service, healthpb.HealthCheckResponse_ServingStatus(v))
	case "count":
		s.mu.Lock()
		keys := make([]string, 0, len(s.counts))
		var total int64
		for k, v := range s.counts {
			keys = append(keys, k)
			total += v
		}
		sort.Strings(keys)
		parts := []string{fmt.Sprintf("total=%d", total)}
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s=%d", k, s.counts[k]))
		}
		s.mu.Unlock()
		answer = strings.Join(parts, " ")
	case "inflight":
		answer = fmt.Sprintf("inflight=%d peak=%d", s.inflight.Load(), s.peak.Load())
	case "conns":
		answer = fmt.Sprintf("conns=%d", s.conns.Load())
	case "release":
		s.releaseHanging()
	case "graceful-stop":
		drain := 100 * time.Millisecond
		for _, a := range f[1:] {
			v, ok := strings.CutPrefix(a, "drain=")
			d, err := time.ParseDuration(v)
			if !ok || err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "graceful-stop: bad option %q", a)
			}
			drain = d
		}
		answer = fmt.Sprintf("stopping inflight=%d", s.inflight.Load())
		go func() {
			time.AfterFunc(drain, s.releaseHanging)
			s.grpc.GracefulStop()
			close(s.stopped)
		}()
	default:
		m, err := parseMode(in.Value)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		s.mu.Lock()
		s.current = m
		s.mu.Unlock()
	}
	return wrapperspb.String(answer), nil
}

func (s *server) releaseHanging() {
	s.mu.Lock()
	close(s.release)
	s.release = make(chan struct{})
	s.mu.Unlock()
}

// connCounter counts the connections that carried a peer.Peer call: a stats.Handler marks each
// connection (TagConn) and counts it at its first such call (TagRPC's context derives from the
// connection's).
type connCounter struct{ s *server }

type connKey struct{}

func (c connCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, new(atomic.Bool))
}

func (c connCounter) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if counted, ok := ctx.Value(connKey{}).(*atomic.Bool); ok && strings.HasPrefix(info.FullMethodName, "/peer.Peer/") {
		if counted.CompareAndSwap(false, true) {
			c.s.conns.Add(1)
		}
	}
	return ctx
}

func (connCounter) HandleConn(context.Context, stats.ConnStats) {}
func (connCounter) HandleRPC(context.Context, stats.RPCStats)   {}

// recoverUnary and recoverStream are the recovery interceptor production grpc-go servers add
// (grpc-ecosystem/go-grpc-middleware's recovery, whose default answers INTERNAL; here the code
// is the mode's, UNKNOWN by default): a handler's panic becomes a status. They recover only the
// panics of mode panic-recovered; mode panic is re-raised and kills the process.
func recovered(err *error) {
	if r := recover(); r != nil {
		p, ok := r.(recoverable)
		if !ok {
			panic(r)
		}
		*err = status.Errorf(p.code, "peer: panic recovered")
	}
}

func recoverUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (_ any, err error) {
	defer recovered(&err)
	return h(ctx, req)
}

func recoverStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer recovered(&err)
	return h(srv, ss)
}

// The services, by hand: what protoc-gen-go-grpc would generate for peer.proto.
var peerDesc = grpc.ServiceDesc{
	ServiceName: "peer.Peer",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Unary",
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(*server).unary(ctx, req.(*wrapperspb.BytesValue))
			}
			if ic == nil {
				return h(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/peer.Peer/Unary"}, h)
		},
	}},
	Streams: []grpc.StreamDesc{
		{StreamName: "ServerStream", ServerStreams: true, Handler: func(srv any, stream grpc.ServerStream) error {
			in := new(wrapperspb.BytesValue)
			if err := stream.RecvMsg(in); err != nil {
				return err
			}
			return srv.(*server).serverStream(in, stream)
		}},
		{StreamName: "ClientStream", ClientStreams: true, Handler: func(srv any, stream grpc.ServerStream) error {
			return srv.(*server).clientStream(stream)
		}},
		{StreamName: "Bidi", ServerStreams: true, ClientStreams: true, Handler: func(srv any, stream grpc.ServerStream) error {
			return srv.(*server).bidi(stream)
		}},
	},
}

var controlDesc = grpc.ServiceDesc{
	ServiceName: "peer.Control",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Set",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return srv.(*server).control(ctx, in)
		},
	}},
}

func main() {
	port := flag.Int("port", 0, "port on 127.0.0.1 (0: any free one)")
	maxStreams := flag.Uint("max-concurrent-streams", 0, "SETTINGS_MAX_CONCURRENT_STREAMS (0: grpc-go's default, unlimited)")
	minTime := flag.Duration("keepalive-min-time", 0, "keepalive enforcement: the least time between a client's pings (0: grpc-go's default, 5m)")
	maxAge := flag.Duration("max-connection-age", 0, "GOAWAY each connection after this long, +/-10% jitter (0: never)")
	maxAgeGrace := flag.Duration("max-connection-age-grace", 0, "after the GOAWAY, close the connection after this long (0: never)")
	initial := flag.String("mode", "ok", "the initial mode (see control)")
	flag.Parse()

	m, err := parseMode(*initial)
	if err != nil {
		log.Fatalf("--mode: %v", err)
	}
	s := &server{current: m, counts: map[string]int64{}, release: make(chan struct{}), stopped: make(chan struct{})}

	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(recoverUnary),
		grpc.ChainStreamInterceptor(recoverStream),
		grpc.StatsHandler(connCounter{s}),
	}
	if *maxStreams > 0 {
		// Advertised in SETTINGS; a stream past it is refused with RST_STREAM REFUSED_STREAM
		// (internal/transport/http2_server.go, operateHeaders), which a client that opens
		// streams before it has read the SETTINGS meets on a new connection.
		opts = append(opts, grpc.MaxConcurrentStreams(uint32(*maxStreams)))
	}
	if *minTime > 0 {
		// https://pkg.go.dev/google.golang.org/grpc/keepalive#EnforcementPolicy and
		// https://github.com/grpc/grpc-go/blob/master/Documentation/keepalive.md: a client
		// that pings more often than MinTime (or at all while it has no call, unless
		// PermitWithoutStream) earns a strike; past 2 strikes the server sends GOAWAY
		// ENHANCE_YOUR_CALM with debug data "too_many_pings" and closes the connection.
		// Strikes reset whenever the server sends headers or data. The GOAWAY's last stream id
		// covers the calls open, which get no status: grpc-go closes the socket when the
		// client does or 1 s later (internal/transport/http2_server.go, grpc-go#5358), and a
		// call still open then sees the connection end (h2: "stream closed because of a broken
		// pipe"); seen with ./frames.
		opts = append(opts, grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             *minTime,
			PermitWithoutStream: false,
		}))
	}
	if *maxAge > 0 || *maxAgeGrace > 0 {
		// https://pkg.go.dev/google.golang.org/grpc/keepalive#ServerParameters: after
		// MaxConnectionAge the server drains the connection (GOAWAY NO_ERROR "max_age", sent
		// twice: first with the last stream id 2^31-1 and a ping, then with the real one),
		// and closes it MaxConnectionAgeGrace later (plus up to 1 s, as above); calls still
		// open then get no status. GracefulStop sends the same pair with "graceful_stop".
		opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      *maxAge,
			MaxConnectionAgeGrace: *maxAgeGrace,
		}))
	}
	s.grpc = grpc.NewServer(opts...)
	s.grpc.RegisterService(&peerDesc, s)
	s.grpc.RegisterService(&controlDesc, s)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)

	lis, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", *port))
	if err != nil {
		log.Fatalf("listen: %v", err)
	}
	// The parent's end of stdin closes when the test process exits, whatever killed it.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	fmt.Printf("LISTENING %d\n", lis.Addr().(*net.TCPAddr).Port)
	_ = os.Stdout.Sync()
	if err := s.grpc.Serve(lis); err != nil {
		log.Fatalf("serve: %v", err)
	}
	// Serve returns as soon as a graceful stop begins: wait until it is over.
	<-s.stopped
}
