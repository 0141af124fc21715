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

// AdmissionOptions bound the Score and Route work taken on, so overload is
// refused fast instead of queueing without limit, and give Lookup, Dump and
// Diagnose a smaller budget of their own. Other calls are never refused
// (Release is what relieves load; MaxWatches bounds Watch).
type AdmissionOptions struct {
	// Off disables admission control.
	Off bool
	// MaxConcurrent bounds Score and Route calls executing at once; 0 means
	// 8 per core.
	MaxConcurrent int
	// Target is the queueing delay (headers to handler) calls are kept
	// under. When the least delayed call of an Interval waited longer, a
	// standing queue formed: the bound on pending calls is cut by a quarter,
	// refusing new calls before their body is read. Each Interval under
	// Target that met the bound raises it by an eighth (up to MaxPending).
	// 0 means 1 ms.
	Target time.Duration
	// Interval is the window Target is judged over; 0 means 50 ms.
	Interval time.Duration
	// MaxQueueDelay refuses a call that waited longer before it could run;
	// during a standing queue a call finding no slot is refused at once.
	// 0 means 50 ms.
	MaxQueueDelay time.Duration
	// MaxPending bounds Score and Route calls started and not finished,
	// refusing more before their body is read: the memory a burst can take
	// (128 maximum-size requests hold about 1.2 GB). 0 means 128.
	MaxPending int
	// MaxInspect bounds Lookup, Dump and Diagnose calls executing at once,
	// apart from Score's slots (each may cost O(a worker's blocks)); 0 means
	// half the cores, at least 1.
	MaxInspect int
	// MaxInspectPending bounds inspection calls waiting for a slot, refusing
	// more before their body is read; 0 means 16.
	MaxInspectPending int
	// InspectWait is the longest an inspection call waits for a slot; 0
	// means 1 s.
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

// DefaultMaxInspect is AdmissionOptions.MaxInspect's default.
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
// pending calls, cut when a standing queue forms (CoDel's test: an
// interval's least queueing delay above a target), enforced in the tap
// handle (no body read or decode); a bound on calls executing; and a bound on
// queueing delay. Inspection calls have a plain budget. tap runs on transport
// reader goroutines; state is atomics, but mu guards the interval's minimum.
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

// minLimit is the adaptive bound's floor: enough to keep every core busy.
func (a *admission) minLimit() int64 { return int64(max(runtime.GOMAXPROCS(0), 2)) }

// arrivalKey keys a call's *callState (counted in pending); inspectKey an
// inspection call's arrival time (counted in inspectPending).
type (
	arrivalKey struct{}
	inspectKey struct{}
)

// callState is when a call's headers arrived (tap) and its message's wire
// size (stats handler).
type callState struct {
	arrived time.Time
	wire    atomic.Int64
}

// bigMessage is the wire size from which a call's delay is mostly its body
// arriving: it is neither measured nor refused for its delay.
const bigMessage = 256 << 10

// tap stamps a new stream's arrival and refuses Score and Route while
// overloaded. It must not block (a connection's reader goroutine).
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

// tapInspect admits an inspection call unless its budget is full.
func (a *admission) tapInspect(ctx context.Context) (context.Context, error) {
	bound := int64(a.o.MaxInspect + a.o.MaxInspectPending)
	if n := a.inspectPending.Add(1); n > bound {
		a.inspectPending.Add(-1)
		a.refused[refusedInspect].Add(1)
		return ctx, overloaded("overloaded: %d Lookup, Dump and Diagnose calls already running or waiting (limits.max_inspect %d, limits.max_inspect_pending %d); retry with backoff", bound, a.o.MaxInspect, a.o.MaxInspectPending)
	}
	return context.WithValue(ctx, inspectKey{}, a.now()), nil
}

// admissionStats is the stats.Handler that sees every admitted call end,
// whether its handler ran or not.
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

// roll ends an interval that is over, adapting the bound (see Target).
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
		// Never above MaxPending, a hard bound, though a small one
		// (under minLimit) then stays where it is.
		limit = min(max(min(limit, a.pending.Load())*3/4, a.minLimit()), int64(a.o.MaxPending))
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
// queueing budget, measuring their delay.
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
			// A standing queue: it would likely wait to be refused anyway.
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

// runInspect runs an inspection call in a slot, waiting at most InspectWait.
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
	// RefusedOverload counts calls refused while overloaded (at start or
	// finding no slot), RefusedQueued those past MaxQueueDelay,
	// RefusedPending those past MaxPending.
	RefusedOverload, RefusedQueued, RefusedPending int64
	// Inspected counts inspection calls that ran, RefusedInspect those
	// refused by their budget.
	Inspected, RefusedInspect int64
	// Pending is the Score and Route calls started and not finished.
	Pending int64
	// Overloaded: the last interval ended with a standing queue; Limit is
	// the bound on pending calls now.
	Overloaded bool
	Limit      int64
}

// AdmissionStats returns the admission counters (zero when off).
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

// An admission refusal is ResourceExhausted with an ErrorInfo of reason
// OverloadReason in ErrorDomain, telling it (retry later) from a request
// over a limit, refused with the same code.
const (
	ErrorDomain    = "kvindex.io"
	OverloadReason = "OVERLOADED"
)

// overloadInfo is the detail every admission refusal carries.
var overloadInfo = &errdetails.ErrorInfo{Reason: OverloadReason, Domain: ErrorDomain}

// overloaded returns an admission refusal (~1 µs, refusals only).
func overloaded(format string, args ...any) error {
	st := status.Newf(codes.ResourceExhausted, format, args...)
	if d, err := st.WithDetails(overloadInfo); err == nil {
		st = d
	}
	return st.Err()
}

// IsOverloaded reports whether err is an admission refusal (not a request
// over a limit): the call did not run; retry with backoff.
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
