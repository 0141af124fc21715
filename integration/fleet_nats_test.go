package integration

import (
	"testing"
	"time"

	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// TestFleetWorkersStayUpAfterNATSRestart: once NATS is back, the replica
// follows the agents' registrations again at once (it watches the bucket
// anew), so a worker whose agent re-registered is not left STALE while
// nats.go's ordered consumer waits out two missed heartbeats (10 s)
// before it notices the server lost it. (Found by the chaos harness: every
// worker STALE and Route failing for ~8 s after nats-server restarted.)
func TestFleetWorkersStayUpAfterNATSRestart(t *testing.T) {
	rig := startFleetRig(t, 1, podSpec{name: "p0", dpSize: 1})
	w := newWorkload(rig, 5)
	for range 40 {
		w.step()
	}
	rig.waitConverged(10 * time.Second)
	rig.nats.s.Shutdown()
	rig.nats.s.WaitForShutdown()
	time.Sleep(2 * time.Second)
	rig.nats.start()
	back := time.Now()
	health := func() kvindexv1.WorkerHealth { return rig.replicas[0].status("p0", 0).GetHealth() }
	for health() != kvindexv1.WorkerHealth_WORKER_HEALTH_OK {
		if time.Since(back) > 10*time.Second {
			t.Fatalf("p0/0 %v 10 s after NATS came back", health())
		}
		w.step()
		time.Sleep(20 * time.Millisecond)
	}
	// The registration TTL is 3 s: a dead watch shows as STALE from
	// 1.5 s after the last registration it delivered.
	for time.Since(back) < 6*time.Second {
		w.step()
		if h := health(); h != kvindexv1.WorkerHealth_WORKER_HEALTH_OK {
			t.Fatalf("p0/0 %v %v after NATS came back: the replica stopped hearing the agent's registrations", h, time.Since(back).Round(time.Millisecond))
		}
		time.Sleep(50 * time.Millisecond)
	}
	rig.waitConverged(10 * time.Second)
}
