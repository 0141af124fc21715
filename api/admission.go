package api

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/kvindex/kvindex/internal/defaults"
)

// AdmissionOptions bound the Score and Route work the server takes on, so
// that overload is refused fast instead of queueing without limit, and
// give the operator's inspection calls (Lookup, Dump, Diagnose) a smaller
// budget of their own, so that a storm of them cannot take the cores
// Score and Route need. Other calls (Release, ListWorkers, health, Watch,
// which MaxWatches bounds) are never refused: Release is what relieves
// load.
type AdmissionOptions struct {
	// Off disables admission control.
	Off bool
	// MaxConcurrent bounds Score and Route calls executing at once; a call
	// waits for a slot within its queueing budget. 0 means 8 per core.
	MaxConcurrent int
	// Target is the queueing delay (from a call's headers arriving to its
	// handler starting) the server keeps calls under. When even the least
	// delayed call of an Interval waited longer, a standing queue has
	// formed: the bound on pending calls is cut by a quarter, so new calls
	// are refused at once, before their body is read or decoded. Each
	// Interval under Target that met the bound raises it again by an
	// eighth (up to MaxPending). 0 means 1 ms.
	Target time.Duration
	// Interval is the window Target is judged over; 0 means 50 ms.
	Interval time.Duration
	// MaxQueueDelay refuses a call that waited longer than this before it
	// could run: a bound on an accepted call's queueing while the bound on
	// pending calls adapts. While a standing queue lasts, a call that finds
	// no free slot is refused at once instead. 0 means 50 ms.
	MaxQueueDelay time.Duration
	// MaxPending bounds Score and Route calls started (headers received)
	// and not finished; more are refused at once, before their body is
	// read. It bounds the memory a burst of large requests can take: each
	// pending call holds at most its message (Server's MaxRecvMsgSize)
	// and its decoded token ids. 0 means 128: a burst of 128
	// maximum-size requests (1 Mi tokens each) holds about 1.2 GB.
	MaxPending int
	// MaxInspect bounds Lookup, Dump and Diagnose calls executing at once.
	// They share no slot with Score and Route: each may cost O(a worker's
	// blocks) (a Dump page) or O(the prompt) (Lookup, Diagnose), so their
	// budget is kept below the cores. 0 means half the cores, at least 1.
	MaxInspect int
	// MaxInspectPending bounds the Lookup, Dump and Diagnose calls waiting
	// for one of MaxInspect's slots; more are refused at once, before
	// their body is read. 0 means 16.
	MaxInspectPending int
	// InspectWait is the longest a Lookup, Dump or Diagnose call waits for
	// a slot before it is refused; 0 means 1 s.
	InspectWait time.Duration
}

// Defaults of the AdmissionOptions fields named in their comments.
const (
	DefaultQueueTarget       = time.Millisecond      // Target
	DefaultQueueInterval     = 50 * time.Millisecond // Interval
	DefaultMaxQueueDelay     = 50 * time.Millisecond // MaxQueueDelay
	DefaultMaxPending        = 128                   // MaxPending
	DefaultMaxInspectPending = 16                    // MaxInspectPending
	DefaultInspectWait       = time.Second           // InspectWait
)

// DefaultMaxInspect is AdmissionOptions.MaxInspect's default: half the
// cores (GOMAXPROCS), at least 1.
func DefaultMaxInspect() int { return max(runtime.GOMAXPROCS(0)/2, 1) }

func (o *AdmissionOptions) defaults() {
	defaults.Positive(&o.MaxConcurrent, 8*runtime.GOMAXPROCS(0))
	defaults.Positive(&o.Target, DefaultQueueTarget)
	defaults.Positive(&o.Interval, DefaultQueueInterval)
	defaults.Positive(&o.MaxQueueDelay, DefaultMaxQueueDelay)
	defaults.Positive(&o.MaxPending, DefaultMaxPending)
	defaults.Positive(&o.MaxInspect, DefaultMaxInspect())
	defaults.Positive(&o.MaxInspectPending, DefaultMaxInspectPending)
	defaults.Positive(&o.InspectWait, DefaultInspectWait)
}

// admitted names the methods admission control applies to.
var admitted = map[string]bool{
	"/kvindex.v1.IndexService/Score": true,
	"/kvindex.v1.IndexService/Route": true,
}

// inspected names the methods of the inspection budget.
var inspected = map[string]bool{
	"/kvindex.v1.IndexService/Lookup":   true,
	"/kvindex.v1.IndexService/Dump":     true,
	"/kvindex.v1.IndexService/Diagnose": true,
}

// Reasons a call is refused, as counted.
const (
	refusedOverload = iota // the adaptive bound on pending calls
	refusedQueued          // waited longer than MaxQueueDelay
	refusedPending         // MaxPending calls were pending
	refusedInspect         // the inspection budget
	numAdmissionRefusals
)

// admission is a server's admission controller: an adaptive bound on
// pending calls, cut when a standing queue forms (CoDel's test: the least
// queueing delay of an interval above a target) and raised while there is
// none, enforced in the tap handle (refusing costs no body read or
// decode); a bound on calls executing; and a bound on an accepted call's
// queueing delay. Inspection calls have a plain budget beside it.
//
// # Concurrency
//
// tap runs on the transports' reader goroutines, the interceptor on call
// goroutines; state is atomics, except the interval's minimum delay,
// which mu guards.
type admission struct {
	o     AdmissionOptions
	slots chan struct{}
	now   func() time.Time

	overloaded atomic.Bool  // the last interval ended with a standing queue
	limit      atomic.Int64 // the adaptive bound on pending calls
	hitLimit   atomic.Bool  // the tap refused for the limit this interval
	pending    atomic.Int64 // calls the tap let through and the stats handler has not seen end
	refused    [numAdmissionRefusals]atomic.Int64
	admittedN  atomic.Int64

	inspectSlots   chan struct{}
	inspectPending atomic.Int64 // inspection calls the tap let through and the stats handler has not seen end
	inspectedN     atomic.Int64

	mu          sync.Mutex // guards intervalEnd, minDelay
	intervalEnd time.Time
	minDelay    time.Duration // least queueing delay seen this interval; -1 for none
}

func newAdmission(o AdmissionOptions, now func() time.Time) *admission {
	o.defaults()
	if now == nil {
		now = time.Now
	}
	a := &admission{o: o, slots: make(chan struct{}, o.MaxConcurrent), inspectSlots: make(chan struct{}, o.MaxInspect), now: now, minDelay: -1}
	a.limit.Store(int64(o.MaxPending))
	return a
}

// minLimit is the least the adaptive bound goes to: enough calls to keep
// every core busy.
func (a *admission) minLimit() int64 { return int64(max(runtime.GOMAXPROCS(0), 2)) }

// arrivalKey is the context key of a call's *callState, and marks it
// counted in pending; inspectKey, of an inspection call's arrival time,
// marks it counted in inspectPending.
type (
	arrivalKey struct{}
	inspectKey struct{}
)

// callState is when a call's headers arrived (set by the tap) and its
// message's wire size (set by the stats handler before the interceptor).
type callState struct {
	arrived time.Time
	wire    atomic.Int64
}

// bigMessage is the wire size from which a call's delay is taken to be
// mostly receiving its body, not queueing: such calls are neither measured
// nor refused for their delay (MaxPending bounds them).
const bigMessage = 256 << 10

// tap is the transport's handle for a new stream: it stamps the arrival
// time and refuses Score and Route while the server is overloaded. It
// must not block (it runs on a connection's reader goroutine).
func (a *admission) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if inspected[info.FullMethodName] {
		return a.tapInspect(ctx)
	}
	if !admitted[info.FullMethodName] {
		return ctx, nil
	}
	now := a.now()
	a.roll(now)
	limit := a.limit.Load()
	if n := a.pending.Add(1); n > limit {
		a.pending.Add(-1)
		if limit < int64(a.o.MaxPending) {
			a.hitLimit.Store(true)
			a.refused[refusedOverload].Add(1)
			return ctx, overloaded("overloaded: calls are queueing; %d pending, the most the server takes now; retry with backoff", limit)
		}
		a.refused[refusedPending].Add(1)
		return ctx, overloaded("overloaded: %d Score and Route calls already pending; retry with backoff", a.o.MaxPending)
	}
	return context.WithValue(ctx, arrivalKey{}, &callState{arrived: now}), nil
}

// tapInspect admits an inspection call to the wait for a slot, unless
// MaxInspect calls run and MaxInspectPending wait already.
func (a *admission) tapInspect(ctx context.Context) (context.Context, error) {
	bound := int64(a.o.MaxInspect + a.o.MaxInspectPending)
	if n := a.inspectPending.Add(1); n > bound {
		a.inspectPending.Add(-1)
		a.refused[refusedInspect].Add(1)
		return ctx, overloaded("overloaded: %d Lookup, Dump and Diagnose calls already running or waiting (limits.max_inspect %d, limits.max_inspect_pending %d); retry with backoff", bound, a.o.MaxInspect, a.o.MaxInspectPending)
	}
	return context.WithValue(ctx, inspectKey{}, a.now()), nil
}

// admissionStats is the stats.Handler that ends a pending call: it sees
// the end of every call the tap let through, whether its handler ran or
// not.
type admissionStats struct{ a *admission }

func (h admissionStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (h admissionStats) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s := s.(type) {
	case *stats.InPayload:
		if cs, ok := ctx.Value(arrivalKey{}).(*callState); ok {
			cs.wire.Store(int64(s.WireLength))
		}
	case *stats.End:
		h.a.done(ctx)
	}
}

// done ends the call of ctx the tap let through: it is no longer pending.
func (a *admission) done(ctx context.Context) {
	if _, ok := ctx.Value(arrivalKey{}).(*callState); ok {
		a.pending.Add(-1)
	} else if _, ok := ctx.Value(inspectKey{}).(time.Time); ok {
		a.inspectPending.Add(-1)
	}
}
func (h admissionStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (h admissionStats) HandleConn(context.Context, stats.ConnStats) {}

// options returns the server options that install a.
func (a *admission) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InTapHandle(a.tap),
		grpc.StatsHandler(admissionStats{a}),
		grpc.ChainUnaryInterceptor(a.interceptor),
	}
}

// roll ends the interval when it is over: a standing queue cuts the bound
// to 3/4 of what was pending; an interval without one that met the bound
// raises it by an eighth, up to MaxPending.
func (a *admission) roll(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.Before(a.intervalEnd) {
		return
	}
	standing := a.minDelay > a.o.Target
	a.overloaded.Store(standing)
	limit := a.limit.Load()
	switch {
	case standing:
		limit = max(min(limit, a.pending.Load())*3/4, a.minLimit())
	case a.hitLimit.Load():
		limit = min(limit+max(limit/8, 1), int64(a.o.MaxPending))
	}
	a.limit.Store(limit)
	a.hitLimit.Store(false)
	a.intervalEnd, a.minDelay = now.Add(a.o.Interval), -1
}

// observe records one admitted call's queueing delay.
func (a *admission) observe(d time.Duration) {
	a.mu.Lock()
	if a.minDelay < 0 || d < a.minDelay {
		a.minDelay = d
	}
	a.mu.Unlock()
}

// interceptor runs Score and Route within the concurrency bound and the
// queueing budget, measuring each call's queueing delay.
func (a *admission) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	cs, ok := ctx.Value(arrivalKey{}).(*callState)
	if !ok {
		if arrived, inspect := ctx.Value(inspectKey{}).(time.Time); inspect {
			return a.runInspect(ctx, arrived, req, h)
		}
		return h(ctx, req)
	}
	arrived, big := cs.arrived, cs.wire.Load() >= bigMessage
	deadline := arrived.Add(a.o.MaxQueueDelay)
	if big {
		deadline = a.now().Add(a.o.MaxQueueDelay) // its delay so far was its body arriving
	}
	select {
	case a.slots <- struct{}{}:
	default:
		if a.overloaded.Load() {
			// A standing queue: a call that finds no slot would wait
			// out most of MaxQueueDelay to be refused anyway; refusing
			// it now gives its client the answer in microseconds.
			a.refused[refusedOverload].Add(1)
			return nil, overloaded("overloaded: calls are queueing and no slot is free; retry with backoff")
		}
		wait := deadline.Sub(a.now())
		if wait <= 0 {
			return nil, a.refuseQueued()
		}
		t := time.NewTimer(wait)
		select {
		case a.slots <- struct{}{}:
			t.Stop()
		case <-t.C:
			return nil, a.refuseQueued()
		case <-ctx.Done():
			t.Stop()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	defer func() { <-a.slots }()
	if !big {
		d := a.now().Sub(arrived)
		a.observe(d)
		if d > a.o.MaxQueueDelay {
			return nil, a.refuseQueued()
		}
	}
	a.admittedN.Add(1)
	return h(ctx, req)
}

// runInspect runs an inspection call in one of MaxInspect's slots,
// waiting for one at most InspectWait from the call's arrival.
func (a *admission) runInspect(ctx context.Context, arrived time.Time, req any, h grpc.UnaryHandler) (any, error) {
	select {
	case a.inspectSlots <- struct{}{}:
	default:
		t := time.NewTimer(arrived.Add(a.o.InspectWait).Sub(a.now()))
		select {
		case a.inspectSlots <- struct{}{}:
			t.Stop()
		case <-t.C:
			a.refused[refusedInspect].Add(1)
			return nil, overloaded("overloaded: waited %v for one of limits.max_inspect's %d slots for Lookup, Dump and Diagnose; retry with backoff", a.o.InspectWait, a.o.MaxInspect)
		case <-ctx.Done():
			t.Stop()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	defer func() { <-a.inspectSlots }()
	a.inspectedN.Add(1)
	return h(ctx, req)
}

func (a *admission) refuseQueued() error {
	a.refused[refusedQueued].Add(1)
	return overloaded("overloaded: the call queued longer than %v; retry with backoff", a.o.MaxQueueDelay)
}

// AdmissionStats are the admission controller's counters.
type AdmissionStats struct {
	// Admitted counts Score and Route calls that ran.
	Admitted int64
	// RefusedOverload counts calls refused while the server was
	// overloaded: at their start, or finding no free slot; RefusedQueued
	// those that queued longer than MaxQueueDelay; RefusedPending those
	// refused at their start because MaxPending calls were pending.
	RefusedOverload, RefusedQueued, RefusedPending int64
	// Inspected counts Lookup, Dump and Diagnose calls that ran;
	// RefusedInspect those refused by their budget (MaxInspect,
	// MaxInspectPending, InspectWait).
	Inspected, RefusedInspect int64
	// Pending is the Score and Route calls started and not finished.
	Pending int64
	// Overloaded reports whether the last interval ended with a standing
	// queue; Limit is the bound on pending calls now.
	Overloaded bool
	Limit      int64
}

// AdmissionStats returns the admission controller's counters (zero when
// admission control is off).
func (s *Server) AdmissionStats() AdmissionStats {
	a := s.admission
	if a == nil {
		return AdmissionStats{}
	}
	return AdmissionStats{
		Admitted:        a.admittedN.Load(),
		RefusedOverload: a.refused[refusedOverload].Load(),
		RefusedQueued:   a.refused[refusedQueued].Load(),
		RefusedPending:  a.refused[refusedPending].Load(),
		Inspected:       a.inspectedN.Load(),
		RefusedInspect:  a.refused[refusedInspect].Load(),
		Pending:         a.pending.Load(),
		Overloaded:      a.overloaded.Load(),
		Limit:           a.limit.Load(),
	}
}

// An admission refusal is ResourceExhausted with a google.rpc.ErrorInfo
// detail of reason OverloadReason in domain ErrorDomain (kvindex's error
// details), so that a client tells it (retry later, elsewhere) from a
// request over a limit, which the same code also refuses.
const (
	ErrorDomain    = "kvindex.io"
	OverloadReason = "OVERLOADED"
)

// overloadInfo is the detail every admission refusal carries.
var overloadInfo = &errdetails.ErrorInfo{Reason: OverloadReason, Domain: ErrorDomain}

// overloaded returns an admission refusal: ResourceExhausted with the
// message and overloadInfo. Cost: one detail marshalled, ~1 µs, on the
// refusal path only.
func overloaded(format string, args ...any) error {
	st := status.Newf(codes.ResourceExhausted, format, args...)
	if d, err := st.WithDetails(overloadInfo); err == nil {
		st = d
	}
	return st.Err()
}

// IsOverloaded reports whether err is admission control refusing a call
// because the server is overloaded (not a request over a limit, which is
// ResourceExhausted too): the call did not run; retry with backoff.
func IsOverloaded(err error) bool {
	st, ok := ServerStatus(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return false
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == OverloadReason && ei.GetDomain() == ErrorDomain {
			return true
		}
	}
	return false
}
