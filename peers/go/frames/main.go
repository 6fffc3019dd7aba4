// Command frames shows what a peer sends on the wire: it opens N unary calls to
// /peer.Peer/Unary on one HTTP/2 connection at once (before it reads the server's SETTINGS),
// optionally pings every -ping, optionally sends a control command on a connection of its own
// after -control-after, and prints each frame the server sends (GOAWAY codes and debug data,
// RST_STREAM codes, trailers) until the connection ends or -for passes.
//
//	go run ./frames -addr 127.0.0.1:PORT -streams 5 -ping 20ms -control "graceful-stop" -control-after 300ms
//
// A diagnostic for people, not used by the tests: how the facts in the peers' comments were
// seen.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func main() {
	addr := flag.String("addr", "", "the peer, host:port")
	n := flag.Int("streams", 1, "unary calls opened at once")
	ping := flag.Duration("ping", 0, "send a PING this often (0: never)")
	payload := flag.String("payload", "x", "each call's payload")
	limit := flag.Duration("for", 5*time.Second, "stop reading after this long")
	control := flag.String("control", "", "a control command to send")
	after := flag.Duration("control-after", 0, "when to send it")
	flag.Parse()

	c, err := net.Dial("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		log.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	_ = fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i := range *n {
		hb.Reset()
		for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/peer.Peer/Unary"},
			{":authority", *addr}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
			_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
		}
		id := uint32(2*i + 1)
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
		// One gRPC message: uncompressed, its length, then field 1 (bytes) of the payload.
		p := []byte(*payload)
		msg := append([]byte{0, 0, 0, 0, byte(len(p) + 2), 0x0a, byte(len(p))}, p...)
		_ = fr.WriteData(id, true, msg)
	}
	start := time.Now()
	if *ping > 0 {
		go func() {
			for i := uint64(1); ; i++ {
				time.Sleep(*ping)
				if err := fr.WritePing(false, [8]byte{byte(i)}); err != nil {
					fmt.Printf("%5dms writing a PING: %v\n", time.Since(start).Milliseconds(), err)
					return
				}
			}
		}()
	}
	if *control != "" {
		go func() {
			time.Sleep(*after)
			conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				log.Fatal(err)
			}
			out := new(wrapperspb.StringValue)
			err = conn.Invoke(context.Background(), "/peer.Control/Set", wrapperspb.String(*control), out)
			fmt.Printf("%5dms control %q: %q %v\n", time.Since(start).Milliseconds(), *control, out.Value, err)
		}()
	}
	dec := hpack.NewDecoder(4096, nil)
	_ = c.SetReadDeadline(time.Now().Add(*limit))
	for {
		f, err := fr.ReadFrame()
		t := time.Since(start).Milliseconds()
		if err != nil {
			fmt.Printf("%5dms read: %v\n", t, err)
			return
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			fmt.Printf("%5dms GOAWAY last=%d code=%v debug=%q\n", t, f.LastStreamID, f.ErrCode, f.DebugData())
		case *http2.RSTStreamFrame:
			fmt.Printf("%5dms RST_STREAM stream=%d code=%v\n", t, f.StreamID, f.ErrCode)
		case *http2.HeadersFrame:
			fields, _ := dec.DecodeFull(f.HeaderBlockFragment())
			fmt.Printf("%5dms HEADERS stream=%d end_stream=%v", t, f.StreamID, f.StreamEnded())
			for _, h := range fields {
				fmt.Printf(" %s=%q", h.Name, h.Value)
			}
			fmt.Println()
		case *http2.SettingsFrame:
			if !f.IsAck() {
				var s []string
				_ = f.ForeachSetting(func(x http2.Setting) error { s = append(s, x.String()); return nil })
				fmt.Printf("%5dms SETTINGS %v\n", t, s)
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if f.IsAck() {
				fmt.Printf("%5dms PING ack\n", t)
			} else {
				fmt.Printf("%5dms PING from the server\n", t)
				_ = fr.WritePing(true, f.Data)
			}
		case *http2.DataFrame:
			fmt.Printf("%5dms DATA stream=%d len=%d end_stream=%v\n", t, f.StreamID, len(f.Data()), f.StreamEnded())
		case *http2.WindowUpdateFrame:
		default:
			fmt.Printf("%5dms %v\n", t, f)
		}
	}
}
