// The xDS control plane peer: a real, unmodified xDS management server for the tests of
// tonic-balancer's xDS client (gRFC A27), built as grpc-go's own end-to-end tests build theirs
// (grpc-go's internal/testutils/xds/e2e): envoyproxy/go-control-plane's SnapshotCache behind its
// v3 server, serving the Aggregated Discovery Service (ADS, state of the world, xDS v3) on
// 127.0.0.1.
//
//	peer-xds --port 0 [--allow-resource-subset] [--verbose] [--nack-delay 100ms]
//	         [--tls-cert server.pem --tls-key server.key [--client-ca ca.pem]]
//
// With --tls-cert and --tls-key it serves over TLS (TLS 1.2 or 1.3, h2), as a control plane that
// gRPC's `tls` channel credentials reach (gRFC A65); with --client-ca too, it requires a client
// certificate signed by that CA (mTLS) and refuses the handshake of a client without one.
//
// It prints `LISTENING <port>` on stdout once it listens, then reads commands on stdin, one JSON
// object per line, and answers each with one line on stdout: `OK <version>` or `ERR <message>`.
// A command is a snapshot spec (`spec` below; fleet-service/src/xds.rs writes it from Rust): the
// listeners, routes, clusters and endpoints that every client gets from now on, whatever its
// node. It exits when stdin closes: the test that started it holds the other end, so it never
// outlives its test.
//
// The cache is go-control-plane's, unmodified, with two rules a test must know:
//   - In ADS mode (the default, as in grpc-go's e2e tests) it answers a request for a type only
//     when the request names every resource of that type in the snapshot: serve only what the
//     clients ask for, or pass --allow-resource-subset.
//   - A client hears of a snapshot only if its version differs from the client's: the same
//     version twice in a row is refused here; an omitted version is numbered here.
//
// And one change of timing: each NACK is held --nack-delay (100 ms) before the cache sees it (see
// StreamRequestFunc below), so that a NACKed snapshot is re-sent ten times a second, not
// thousands.
//
// What it logs goes to stderr: warnings and errors of the cache, the streams that open and close,
// and every NACK (a request carrying error_detail) with the client's message; with --verbose,
// every request and response too.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wrrv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/client_side_weighted_round_robin/v3"
	leastrequestv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"
	pickfirstv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/pick_first/v3"
	ringhashv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/ring_hash/v3"
	roundrobinv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/round_robin/v3"
	wrrlocalityv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/wrr_locality/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	glog "github.com/envoyproxy/go-control-plane/pkg/log"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ---------------------------------------------------------------------------------------------
// The snapshot spec: the JSON of one command. Every optional field is a pointer (or an empty
// slice): omitted means not set in the proto, so that a test can send exactly the resource it
// means, including the ones a client must reject.

type spec struct {
	// The snapshot's version (every resource type gets it). Omitted: the peer numbers its
	// snapshots itself (1, 2, ...). The same version twice in a row is refused: the cache would
	// send nothing to the clients that have it, and the test would wait for an update that never
	// comes.
	Version   *string        `json:"version"`
	Listeners []listenerSpec `json:"listeners"`
	Routes    []routeSpec    `json:"routes"`
	Clusters  []clusterSpec  `json:"clusters"`
	Endpoints []endpointSpec `json:"endpoints"`
}

// A client-side listener: an ApiListener whose HttpConnectionManager names its route
// configuration (RDS) or carries it inline.
type listenerSpec struct {
	Name string `json:"name"`
	// RDS: the route configuration's name, fetched over ADS.
	Rds *string `json:"rds"`
	// Inline: the route configuration itself (its name optional).
	Inline *routeSpec `json:"inline"`
	// No HTTP filters at all: gRPC clients must NACK a listener without the router filter.
	NoRouter bool `json:"no_router"`
}

type routeSpec struct {
	Name         string            `json:"name"`
	VirtualHosts []virtualHostSpec `json:"virtual_hosts"`
}

// A virtual host with one route: prefix `prefix` (default "", which matches every path) to one
// cluster or to weighted clusters; `routes_before` come before it, in order (A28: the first
// route that matches a call takes it).
type virtualHostSpec struct {
	Name             *string             `json:"name"`
	Domains          []string            `json:"domains"`
	Prefix           *string             `json:"prefix"`
	Cluster          *string             `json:"cluster"`
	WeightedClusters []weightedClusterSp `json:"weighted_clusters"`
	RoutesBefore     []routeEntrySpec    `json:"routes_before"`
}

// One route: by path prefix, or by whole path (`path`), optionally case-insensitive, to one
// cluster or to weighted clusters.
type routeEntrySpec struct {
	Prefix           *string             `json:"prefix"`
	Path             *string             `json:"path"`
	CaseInsensitive  bool                `json:"case_insensitive"`
	Cluster          *string             `json:"cluster"`
	WeightedClusters []weightedClusterSp `json:"weighted_clusters"`
}

type weightedClusterSp struct {
	Name   string  `json:"name"`
	Weight *uint32 `json:"weight"`
}

type clusterSpec struct {
	Name string `json:"name"`
	// "EDS" (the default) or "STATIC" (which gRPC does not support: for NACK tests).
	Type *string `json:"type"`
	// EDS: the name of the ClusterLoadAssignment to fetch (omitted: the cluster's name).
	EdsServiceName *string `json:"eds_service_name"`
	// STATIC: the endpoints, in the cluster itself.
	LoadAssignment *endpointSpec `json:"load_assignment"`
	// The legacy enum (Cluster.lb_policy): ROUND_ROBIN, LEAST_REQUEST, RING_HASH, RANDOM,
	// MAGLEV, CLUSTER_PROVIDED, LOAD_BALANCING_POLICY_CONFIG.
	LbPolicy *string `json:"lb_policy"`
	// Cluster.load_balancing_policy (gRFC A52): a policy, or a list of them in order of
	// preference (the client takes the first it supports).
	LoadBalancingPolicy policyList `json:"load_balancing_policy"`
	// Cluster.outlier_detection (gRFC A50): present (even empty) turns it on.
	OutlierDetection *outlierSpec `json:"outlier_detection"`
	// circuit_breakers.thresholds[0] (priority DEFAULT).max_requests (gRFC A32).
	MaxRequests *uint32 `json:"max_requests"`
}

// One load-balancing policy: a name, and the settings of the policies that have some. In JSON
// either the name alone ("ring_hash") or an object ({"name": "ring_hash", "min_ring_size": 64}).
type policySpec struct {
	// round_robin, least_request, wrr (ClientSideWeightedRoundRobin), ring_hash, pick_first,
	// wrr_locality (with `child`); or a type URL (containing '/') for a policy no client knows:
	// an Any of that type with an empty value.
	Name string `json:"name"`
	// least_request.
	ChoiceCount *uint32 `json:"choice_count"`
	// ring_hash.
	MinRingSize *uint64 `json:"min_ring_size"`
	MaxRingSize *uint64 `json:"max_ring_size"`
	// pick_first.
	ShuffleAddressList bool `json:"shuffle_address_list"`
	// wrr.
	EnableOobLoadReport     *bool    `json:"enable_oob_load_report"`
	OobReportingPeriodMs    *uint64  `json:"oob_reporting_period_ms"`
	BlackoutPeriodMs        *uint64  `json:"blackout_period_ms"`
	WeightExpirationMs      *uint64  `json:"weight_expiration_period_ms"`
	WeightUpdatePeriodMs    *uint64  `json:"weight_update_period_ms"`
	ErrorUtilizationPenalty *float32 `json:"error_utilization_penalty"`
	// wrr_locality: the endpoint-picking policy inside it.
	Child *policySpec `json:"child"`
}

func (p *policySpec) UnmarshalJSON(b []byte) error {
	var name string
	if json.Unmarshal(b, &name) == nil {
		*p = policySpec{Name: name}
		return nil
	}
	type plain policySpec // without this method
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	return dec.Decode((*plain)(p))
}

// A policy or a list of them.
type policyList []policySpec

func (l *policyList) UnmarshalJSON(b []byte) error {
	var list []policySpec
	if err := json.Unmarshal(b, &list); err == nil {
		*l = list
		return nil
	}
	var one policySpec
	if err := json.Unmarshal(b, &one); err != nil {
		return err
	}
	*l = policyList{one}
	return nil
}

// OutlierDetection's fields, each omitted means unset; durations in milliseconds.
type outlierSpec struct {
	Consecutive5xx                     *uint32 `json:"consecutive_5xx"`
	EnforcingConsecutive5xx            *uint32 `json:"enforcing_consecutive_5xx"`
	ConsecutiveGatewayFailure          *uint32 `json:"consecutive_gateway_failure"`
	EnforcingConsecutiveGatewayFailure *uint32 `json:"enforcing_consecutive_gateway_failure"`
	IntervalMs                         *uint64 `json:"interval_ms"`
	BaseEjectionTimeMs                 *uint64 `json:"base_ejection_time_ms"`
	MaxEjectionTimeMs                  *uint64 `json:"max_ejection_time_ms"`
	MaxEjectionPercent                 *uint32 `json:"max_ejection_percent"`
	SuccessRateStdevFactor             *uint32 `json:"success_rate_stdev_factor"`
	EnforcingSuccessRate               *uint32 `json:"enforcing_success_rate"`
	SuccessRateMinimumHosts            *uint32 `json:"success_rate_minimum_hosts"`
	SuccessRateRequestVolume           *uint32 `json:"success_rate_request_volume"`
	FailurePercentageThreshold         *uint32 `json:"failure_percentage_threshold"`
	EnforcingFailurePercentage         *uint32 `json:"enforcing_failure_percentage"`
	FailurePercentageMinimumHosts      *uint32 `json:"failure_percentage_minimum_hosts"`
	FailurePercentageRequestVolume     *uint32 `json:"failure_percentage_request_volume"`
}

// A ClusterLoadAssignment.
type endpointSpec struct {
	ClusterName   string         `json:"cluster_name"`
	Localities    []localitySpec `json:"localities"`
	DropOverloads []dropSpec     `json:"drop_overloads"`
}

type localitySpec struct {
	Region  string `json:"region"`
	Zone    string `json:"zone"`
	SubZone string `json:"sub_zone"`
	// LocalityLbEndpoints.load_balancing_weight. gRPC ignores a locality whose weight is unset
	// or 0.
	Weight   *uint32        `json:"weight"`
	Priority uint32         `json:"priority"`
	Eps      []endpointAddr `json:"endpoints"`
}

type endpointAddr struct {
	Address string `json:"address"`
	Port    uint32 `json:"port"`
	// HEALTHY, UNKNOWN, UNHEALTHY, DRAINING, TIMEOUT, DEGRADED (omitted: unset, i.e. UNKNOWN).
	Health *string `json:"health"`
	// LbEndpoint.load_balancing_weight.
	Weight *uint32 `json:"weight"`
}

type dropSpec struct {
	Category   string `json:"category"`
	PerMillion uint32 `json:"per_million"`
}

// ---------------------------------------------------------------------------------------------
// From the spec to the resources. Each builder follows grpc-go's e2e helpers
// (DefaultClientListener, DefaultRouteConfig, DefaultCluster, EndpointResourceWithOptions),
// written again here with every field the spec can leave out.

// ADS as a config source: what a gRPC client needs for RDS and EDS (it NACKs any other source).
func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
	}
}

func toAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("anypb.New(%T): %v", m, err))
	}
	return a
}

func u32(v *uint32) *wrapperspb.UInt32Value {
	if v == nil {
		return nil
	}
	return wrapperspb.UInt32(*v)
}

func u64(v *uint64) *wrapperspb.UInt64Value {
	if v == nil {
		return nil
	}
	return wrapperspb.UInt64(*v)
}

func ms(v *uint64) *durationpb.Duration {
	if v == nil {
		return nil
	}
	return durationpb.New(time.Duration(*v) * time.Millisecond)
}

func listener(s listenerSpec) (*listenerv3.Listener, error) {
	hcm := &hcmv3.HttpConnectionManager{}
	switch {
	case s.Rds != nil && s.Inline != nil:
		return nil, fmt.Errorf("listener %q: both rds and inline", s.Name)
	case s.Rds != nil:
		hcm.RouteSpecifier = &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    ads(),
			RouteConfigName: *s.Rds,
		}}
	case s.Inline != nil:
		rc, err := routeConfig(*s.Inline)
		if err != nil {
			return nil, fmt.Errorf("listener %q: %w", s.Name, err)
		}
		hcm.RouteSpecifier = &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: rc}
	default:
		return nil, fmt.Errorf("listener %q: neither rds nor inline", s.Name)
	}
	// The router filter must be the last (here the only) filter: gRPC clients NACK a listener
	// without it (gRFC A39). Its settings are unused by gRPC.
	if !s.NoRouter {
		hcm.HttpFilters = []*hcmv3.HttpFilter{{
			Name:       "router",
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: toAny(&routerv3.Router{})},
		}}
	}
	return &listenerv3.Listener{
		Name:        s.Name,
		ApiListener: &listenerv3.ApiListener{ApiListener: toAny(hcm)},
	}, nil
}

func routeConfig(s routeSpec) (*routev3.RouteConfiguration, error) {
	rc := &routev3.RouteConfiguration{Name: s.Name}
	for i, vh := range s.VirtualHosts {
		name := fmt.Sprintf("vh-%d", i)
		if vh.Name != nil {
			name = *vh.Name
		}
		prefix := ""
		if vh.Prefix != nil {
			prefix = *vh.Prefix
		}
		var routes []*routev3.Route
		for _, r := range append(vh.RoutesBefore, routeEntrySpec{Prefix: &prefix, Cluster: vh.Cluster, WeightedClusters: vh.WeightedClusters}) {
			route, err := routeOf(r)
			if err != nil {
				return nil, fmt.Errorf("route %q, virtual host %q: %v", s.Name, name, err)
			}
			routes = append(routes, route)
		}
		rc.VirtualHosts = append(rc.VirtualHosts, &routev3.VirtualHost{
			Name:    name,
			Domains: vh.Domains,
			Routes:  routes,
		})
	}
	return rc, nil
}

func routeOf(r routeEntrySpec) (*routev3.Route, error) {
	action := &routev3.RouteAction{}
	switch {
	case r.Cluster != nil && len(r.WeightedClusters) > 0:
		return nil, fmt.Errorf("both cluster and weighted_clusters")
	case r.Cluster != nil:
		action.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: *r.Cluster}
	case len(r.WeightedClusters) > 0:
		wc := &routev3.WeightedCluster{}
		for _, c := range r.WeightedClusters {
			wc.Clusters = append(wc.Clusters, &routev3.WeightedCluster_ClusterWeight{
				Name:   c.Name,
				Weight: u32(c.Weight),
			})
		}
		action.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: wc}
	default:
		return nil, fmt.Errorf("neither cluster nor weighted_clusters")
	}
	match := &routev3.RouteMatch{}
	switch {
	case r.Path != nil:
		match.PathSpecifier = &routev3.RouteMatch_Path{Path: *r.Path}
	case r.Prefix != nil:
		match.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: *r.Prefix}
	default:
		match.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: ""}
	}
	if r.CaseInsensitive {
		match.CaseSensitive = wrapperspb.Bool(false)
	}
	return &routev3.Route{Match: match, Action: &routev3.Route_Route{Route: action}}, nil
}

func cluster(s clusterSpec) (*clusterv3.Cluster, error) {
	c := &clusterv3.Cluster{Name: s.Name}
	kind := "EDS"
	if s.Type != nil {
		kind = *s.Type
	}
	switch kind {
	case "EDS":
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
		c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads()}
		if s.EdsServiceName != nil {
			c.EdsClusterConfig.ServiceName = *s.EdsServiceName
		}
	case "STATIC":
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}
		if s.LoadAssignment != nil {
			la, err := loadAssignment(*s.LoadAssignment)
			if err != nil {
				return nil, fmt.Errorf("cluster %q: %w", s.Name, err)
			}
			c.LoadAssignment = la
		}
	default:
		return nil, fmt.Errorf("cluster %q: type %q (EDS or STATIC)", s.Name, kind)
	}
	if s.LbPolicy != nil {
		v, ok := clusterv3.Cluster_LbPolicy_value[*s.LbPolicy]
		if !ok {
			return nil, fmt.Errorf("cluster %q: lb_policy %q", s.Name, *s.LbPolicy)
		}
		c.LbPolicy = clusterv3.Cluster_LbPolicy(v)
	}
	if len(s.LoadBalancingPolicy) > 0 {
		lbp := &clusterv3.LoadBalancingPolicy{}
		for _, p := range s.LoadBalancingPolicy {
			tec, err := policy(p)
			if err != nil {
				return nil, fmt.Errorf("cluster %q: %w", s.Name, err)
			}
			lbp.Policies = append(lbp.Policies, &clusterv3.LoadBalancingPolicy_Policy{TypedExtensionConfig: tec})
		}
		c.LoadBalancingPolicy = lbp
	}
	if o := s.OutlierDetection; o != nil {
		c.OutlierDetection = &clusterv3.OutlierDetection{
			Consecutive_5Xx:                    u32(o.Consecutive5xx),
			EnforcingConsecutive_5Xx:           u32(o.EnforcingConsecutive5xx),
			ConsecutiveGatewayFailure:          u32(o.ConsecutiveGatewayFailure),
			EnforcingConsecutiveGatewayFailure: u32(o.EnforcingConsecutiveGatewayFailure),
			Interval:                           ms(o.IntervalMs),
			BaseEjectionTime:                   ms(o.BaseEjectionTimeMs),
			MaxEjectionTime:                    ms(o.MaxEjectionTimeMs),
			MaxEjectionPercent:                 u32(o.MaxEjectionPercent),
			SuccessRateStdevFactor:             u32(o.SuccessRateStdevFactor),
			EnforcingSuccessRate:               u32(o.EnforcingSuccessRate),
			SuccessRateMinimumHosts:            u32(o.SuccessRateMinimumHosts),
			SuccessRateRequestVolume:           u32(o.SuccessRateRequestVolume),
			FailurePercentageThreshold:         u32(o.FailurePercentageThreshold),
			EnforcingFailurePercentage:         u32(o.EnforcingFailurePercentage),
			FailurePercentageMinimumHosts:      u32(o.FailurePercentageMinimumHosts),
			FailurePercentageRequestVolume:     u32(o.FailurePercentageRequestVolume),
		}
	}
	if s.MaxRequests != nil {
		c.CircuitBreakers = &clusterv3.CircuitBreakers{
			Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
				Priority:    corev3.RoutingPriority_DEFAULT,
				MaxRequests: u32(s.MaxRequests),
			}},
		}
	}
	return c, nil
}

// A policy of Cluster.load_balancing_policy as the typed extension config gRPC reads (A52).
func policy(p policySpec) (*corev3.TypedExtensionConfig, error) {
	var m proto.Message
	switch p.Name {
	case "round_robin":
		m = &roundrobinv3.RoundRobin{}
	case "least_request":
		m = &leastrequestv3.LeastRequest{ChoiceCount: u32(p.ChoiceCount)}
	case "wrr":
		m = &wrrv3.ClientSideWeightedRoundRobin{
			EnableOobLoadReport:     boolValue(p.EnableOobLoadReport),
			OobReportingPeriod:      ms(p.OobReportingPeriodMs),
			BlackoutPeriod:          ms(p.BlackoutPeriodMs),
			WeightExpirationPeriod:  ms(p.WeightExpirationMs),
			WeightUpdatePeriod:      ms(p.WeightUpdatePeriodMs),
			ErrorUtilizationPenalty: floatValue(p.ErrorUtilizationPenalty),
		}
	case "ring_hash":
		m = &ringhashv3.RingHash{MinimumRingSize: u64(p.MinRingSize), MaximumRingSize: u64(p.MaxRingSize)}
	case "pick_first":
		m = &pickfirstv3.PickFirst{ShuffleAddressList: p.ShuffleAddressList}
	case "wrr_locality":
		if p.Child == nil {
			return nil, fmt.Errorf("policy wrr_locality without child")
		}
		child, err := policy(*p.Child)
		if err != nil {
			return nil, err
		}
		m = &wrrlocalityv3.WrrLocality{EndpointPickingPolicy: &clusterv3.LoadBalancingPolicy{
			Policies: []*clusterv3.LoadBalancingPolicy_Policy{{TypedExtensionConfig: child}},
		}}
	default:
		if !strings.Contains(p.Name, "/") {
			return nil, fmt.Errorf("policy %q (round_robin, least_request, wrr, ring_hash, pick_first, wrr_locality, or a type URL)", p.Name)
		}
		// A policy no client knows, to test that a client skips it (or NACKs when it is alone).
		return &corev3.TypedExtensionConfig{Name: p.Name, TypedConfig: &anypb.Any{TypeUrl: p.Name}}, nil
	}
	return &corev3.TypedExtensionConfig{Name: p.Name, TypedConfig: toAny(m)}, nil
}

func boolValue(v *bool) *wrapperspb.BoolValue {
	if v == nil {
		return nil
	}
	return wrapperspb.Bool(*v)
}

func floatValue(v *float32) *wrapperspb.FloatValue {
	if v == nil {
		return nil
	}
	return wrapperspb.Float(*v)
}

func loadAssignment(s endpointSpec) (*endpointv3.ClusterLoadAssignment, error) {
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: s.ClusterName}
	for _, l := range s.Localities {
		lle := &endpointv3.LocalityLbEndpoints{
			Locality:            &corev3.Locality{Region: l.Region, Zone: l.Zone, SubZone: l.SubZone},
			LoadBalancingWeight: u32(l.Weight),
			Priority:            l.Priority,
		}
		for _, e := range l.Eps {
			lbe := &endpointv3.LbEndpoint{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
						SocketAddress: &corev3.SocketAddress{
							Protocol:      corev3.SocketAddress_TCP,
							Address:       e.Address,
							PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: e.Port},
						},
					}},
				}},
				LoadBalancingWeight: u32(e.Weight),
			}
			if e.Health != nil {
				v, ok := corev3.HealthStatus_value[*e.Health]
				if !ok {
					return nil, fmt.Errorf("endpoints %q: health %q", s.ClusterName, *e.Health)
				}
				lbe.HealthStatus = corev3.HealthStatus(v)
			}
			lle.LbEndpoints = append(lle.LbEndpoints, lbe)
		}
		cla.Endpoints = append(cla.Endpoints, lle)
	}
	if len(s.DropOverloads) > 0 {
		cla.Policy = &endpointv3.ClusterLoadAssignment_Policy{}
		for _, d := range s.DropOverloads {
			cla.Policy.DropOverloads = append(cla.Policy.DropOverloads, &endpointv3.ClusterLoadAssignment_Policy_DropOverload{
				Category: d.Category,
				DropPercentage: &typev3.FractionalPercent{
					Numerator:   d.PerMillion,
					Denominator: typev3.FractionalPercent_MILLION,
				},
			})
		}
	}
	return cla, nil
}

// The snapshot of a spec. Not checked with Consistent(): tests send inconsistent snapshots on
// purpose (a route naming a cluster that is gone, a deleted resource).
func snapshot(s spec, version string) (*cachev3.Snapshot, error) {
	res := map[resourcev3.Type][]types.Resource{
		resourcev3.ListenerType: {},
		resourcev3.RouteType:    {},
		resourcev3.ClusterType:  {},
		resourcev3.EndpointType: {},
	}
	for _, l := range s.Listeners {
		r, err := listener(l)
		if err != nil {
			return nil, err
		}
		res[resourcev3.ListenerType] = append(res[resourcev3.ListenerType], r)
	}
	for _, rt := range s.Routes {
		r, err := routeConfig(rt)
		if err != nil {
			return nil, err
		}
		res[resourcev3.RouteType] = append(res[resourcev3.RouteType], r)
	}
	for _, c := range s.Clusters {
		r, err := cluster(c)
		if err != nil {
			return nil, err
		}
		res[resourcev3.ClusterType] = append(res[resourcev3.ClusterType], r)
	}
	for _, e := range s.Endpoints {
		r, err := loadAssignment(e)
		if err != nil {
			return nil, err
		}
		res[resourcev3.EndpointType] = append(res[resourcev3.EndpointType], r)
	}
	return cachev3.NewSnapshot(version, res)
}

// ---------------------------------------------------------------------------------------------
// The server.

// Every client gets the one snapshot, whatever its node id: the tests name nodes as they like.
type allNodes struct{}

func (allNodes) ID(*corev3.Node) string { return "all" }

const nodeKey = "all"

func main() {
	port := flag.Int("port", 0, "the port on 127.0.0.1 (0: a free one)")
	// As grpc-go's e2e ManagementServerOptions.AllowResourceSubset: by default (ads=true) the
	// cache answers a request only when it names every resource of that type in the snapshot.
	subset := flag.Bool("allow-resource-subset", false, "answer requests that name only some of the snapshot's resources (ads=false)")
	verbose := flag.Bool("verbose", false, "log every request and response on stderr")
	nackDelay := flag.Duration("nack-delay", 100*time.Millisecond, "how long a NACK waits before the cache sees it (0: at once)")
	tlsCert := flag.String("tls-cert", "", "serve over TLS with this certificate (PEM; with --tls-key)")
	tlsKey := flag.String("tls-key", "", "the private key of --tls-cert (PEM)")
	clientCA := flag.String("client-ca", "", "with TLS: require a client certificate signed by this CA (PEM): mTLS")
	flag.Parse()
	logger := log.New(os.Stderr, "peer-xds: ", log.Lmicroseconds)
	serverOpts, err := tlsOptions(*tlsCert, *tlsKey, *clientCA)
	if err != nil {
		logger.Fatalf("TLS: %v", err)
	}

	cacheLog := glog.LoggerFuncs{
		WarnFunc:  func(f string, a ...any) { logger.Printf("cache warning: "+f, a...) },
		ErrorFunc: func(f string, a ...any) { logger.Printf("cache error: "+f, a...) },
	}
	if *verbose {
		cacheLog.DebugFunc = func(f string, a ...any) { logger.Printf("cache: "+f, a...) }
		cacheLog.InfoFunc = cacheLog.DebugFunc
	}
	cache := cachev3.NewSnapshotCache(!*subset, allNodes{}, cacheLog)

	callbacks := serverv3.CallbackFuncs{
		StreamOpenFunc: func(_ context.Context, id int64, typeURL string) error {
			logger.Printf("stream %d open %s", id, typeURL)
			return nil
		},
		StreamClosedFunc: func(id int64, node *corev3.Node) {
			logger.Printf("stream %d closed (node %q)", id, node.GetId())
		},
		StreamRequestFunc: func(id int64, req *discoveryv3.DiscoveryRequest) error {
			if e := req.GetErrorDetail(); e != nil {
				logger.Printf("stream %d NACK %s version %q nonce %q: %s", id, req.GetTypeUrl(),
					req.GetVersionInfo(), req.GetResponseNonce(), e.GetMessage())
				// A NACK carries the version the client still has, not the snapshot's: the
				// cache answers it at once with the same snapshot, which the client NACKs
				// again, thousands of times a second (7,000 in 3 s with grpcio) until the next
				// snapshot. Holding each NACK a little (this callback runs on the stream's
				// receiving goroutine) makes that ten a second: the same exchange, slower.
				time.Sleep(*nackDelay)
			} else if *verbose {
				logger.Printf("stream %d request %s %v version %q nonce %q (node %q)", id, req.GetTypeUrl(),
					req.GetResourceNames(), req.GetVersionInfo(), req.GetResponseNonce(), req.GetNode().GetId())
			}
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, _ *discoveryv3.DiscoveryRequest, resp *discoveryv3.DiscoveryResponse) {
			if *verbose {
				logger.Printf("stream %d response %s version %q nonce %q, %d resources", id, resp.GetTypeUrl(),
					resp.GetVersionInfo(), resp.GetNonce(), len(resp.GetResources()))
			}
		},
	}
	// The server's context is never cancelled: the process ends when stdin closes.
	xds := serverv3.NewServer(context.Background(), cache, callbacks)
	gs := grpc.NewServer(serverOpts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, xds)

	// Go's listeners set SO_REUSEADDR: a restarted peer gets the same port back at once.
	lis, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(*port)))
	if err != nil {
		logger.Fatalf("listen: %v", err)
	}
	go func() {
		if err := gs.Serve(lis); err != nil {
			logger.Fatalf("serve: %v", err)
		}
	}()
	out := bufio.NewWriter(os.Stdout)
	var outMu sync.Mutex
	say := func(line string) {
		outMu.Lock()
		defer outMu.Unlock()
		out.WriteString(line + "\n")
		out.Flush()
	}
	say(fmt.Sprintf("LISTENING %d", lis.Addr().(*net.TCPAddr).Port))

	// Commands, one JSON object per line, answered in order.
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64*1024), 16*1024*1024)
	var last string
	numbered := 0
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		version, err := apply(cache, line, last, &numbered)
		if err != nil {
			// One line: the harness reads answers line by line.
			say("ERR " + strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		last = version
		say("OK " + version)
	}
	// Stdin closed: the test is over (or dead).
	os.Exit(0)
}

// The server's options for TLS: none without a certificate (plaintext, h2c), else TLS with it,
// and with a client CA, mTLS (a client without a certificate that CA signed is refused in the
// handshake).
func tlsOptions(certFile, keyFile, clientCAFile string) ([]grpc.ServerOption, error) {
	if certFile == "" && keyFile == "" {
		if clientCAFile != "" {
			return nil, fmt.Errorf("--client-ca needs --tls-cert and --tls-key")
		}
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %q, --tls-key %q: %w", certFile, keyFile, err)
	}
	config := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		pem, err := os.ReadFile(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("--client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--client-ca %q: no PEM certificate in it", clientCAFile)
		}
		config.ClientCAs = pool
		config.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(config))}, nil
}

// Applies one command line: the snapshot it describes replaces the one every client gets.
func apply(cache cachev3.SnapshotCache, line, last string, numbered *int) (string, error) {
	dec := json.NewDecoder(strings.NewReader(line))
	// A misspelt field is an error, not a resource silently left unset.
	dec.DisallowUnknownFields()
	var s spec
	if err := dec.Decode(&s); err != nil {
		return "", fmt.Errorf("the snapshot spec: %w", err)
	}
	var version string
	if s.Version != nil {
		version = *s.Version
	} else {
		*numbered++
		version = strconv.Itoa(*numbered)
		if version == last {
			*numbered++
			version = strconv.Itoa(*numbered)
		}
	}
	if version == "" {
		return "", fmt.Errorf("an empty version")
	}
	if version == last {
		return "", fmt.Errorf("version %q again: the clients that have it would get no update", version)
	}
	snap, err := snapshot(s, version)
	if err != nil {
		return "", err
	}
	if err := cache.SetSnapshot(context.Background(), nodeKey, snap); err != nil {
		return "", fmt.Errorf("SetSnapshot: %w", err)
	}
	return version, nil
}
