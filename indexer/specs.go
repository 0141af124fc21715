package indexer

// sideSpec is a worker's side groups of one description (class, window,
// block size), which vLLM caches and looks up together (its coordinator's
// SpecGroup: Gemma 3's five sliding-window groups are one): a block is
// held by the spec when every member holds it, and Cap reads one map per
// block for all of them rather than one per member.
//
// A spec of one member reads that member's held map; a spec of more keeps
// held, the members holding each key as bits (member i is bit i), kept by
// sideHoldLocked and sideUnholdLocked as members' keys become and stop
// being held. Guarded by sideStore.mu, as the members' maps.
type sideSpec struct {
	class     GroupClass
	window    int
	blockSize int
	members   []*sideGroup // in index order
	full      uint64       // every member's bit
	held      map[Key]uint64
}

// has reports whether every member holds k. Callers hold side.mu.
func (sp *sideSpec) has(k Key) bool {
	if sp.held == nil {
		return sp.members[0].held[k] != 0
	}
	return sp.held[k] == sp.full
}

// rebuildSpecsLocked regroups the side groups into specs after a group was
// added, dropped or learned its block size, or keys were restored. Groups
// of no block size yet hold nothing and are left out. Cost: O(the side
// groups' held keys) for specs of several members; rare.
func (w *Worker) rebuildSpecsLocked() {
	w.side.mu.Lock()
	defer w.side.mu.Unlock()
	var specs []*sideSpec
	for _, sg := range w.side.order {
		sg.spec, sg.bit = nil, 0
		if sg.g.BlockSize <= 0 {
			continue
		}
		var sp *sideSpec
		for _, s := range specs {
			if s.class == sg.g.Class && s.window == sg.g.Window && s.blockSize == sg.g.BlockSize {
				sp = s
			}
		}
		if sp == nil {
			sp = &sideSpec{class: sg.g.Class, window: sg.g.Window, blockSize: sg.g.BlockSize}
			specs = append(specs, sp)
		}
		sg.spec, sg.bit = sp, 1<<len(sp.members)
		sp.full |= sg.bit
		sp.members = append(sp.members, sg)
	}
	for _, sp := range specs {
		if len(sp.members) < 2 {
			continue
		}
		sp.held = make(map[Key]uint64, len(sp.members[0].held))
		for _, sg := range sp.members {
			for k := range sg.held {
				sp.held[k] |= sg.bit
			}
		}
	}
	w.side.specs = specs
}

// specHoldLocked and specUnholdLocked keep sg's spec's bits as sg's key k
// becomes and stops being held. Callers hold side.mu.
func (sg *sideGroup) specHoldLocked(k Key) {
	if sp := sg.spec; sp != nil && sp.held != nil {
		sp.held[k] |= sg.bit
	}
}

func (sg *sideGroup) specUnholdLocked(k Key) {
	if sp := sg.spec; sp != nil && sp.held != nil {
		if v := sp.held[k] &^ sg.bit; v != 0 {
			sp.held[k] = v
		} else {
			delete(sp.held, k)
		}
	}
}
