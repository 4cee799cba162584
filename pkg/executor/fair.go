package executor

import (
	"encoding/json"
	"fmt"
	"time"
)

// SlotOrder says which waiting task takes the executor's next free
// parallelism slot (Config.SlotOrder).
type SlotOrder string

const (
	// SlotOrderFair shares the slots between the namespaces that have
	// waiting tasks: the next free slot goes to the one that holds the
	// fewest slots for its weight (Config.NamespaceWeights), so a namespace
	// that submits 10 tasks behind another's 10,000 gets the next slot that
	// frees, and namespaces with waiting tasks take free slots in turn.
	// Ties go to the namespace whose next task was submitted first.
	SlotOrderFair SlotOrder = "fair"
	// SlotOrderFIFO keeps one line for all namespaces, by priority, then
	// submission time: the order before fair sharing (a baseline). Namespace
	// limits still apply: a task of a namespace at its limit does not hold
	// up the others.
	SlotOrderFIFO SlotOrder = "fifo"
)

// waiter is a task waiting for a parallelism slot. In its namespace's line
// tasks are ordered by priority (higher first), then submission time
// (CreatedAt), then ID.
type waiter struct {
	prio int32
	at   time.Time
	id   string
}

func (w waiter) before(o waiter) bool {
	if w.prio != o.prio {
		return w.prio > o.prio
	}
	if !w.at.Equal(o.at) {
		return w.at.Before(o.at)
	}
	return w.id < o.id
}

// placed is a waiter and its namespace.
type placed struct {
	ns string
	w  waiter
}

// nsSlots is one namespace's part of a slot decision.
type nsSlots struct {
	used    int      // slots its pods (and admitted creations) hold
	limit   int      // its own cap; 0: none but the executor's
	weight  int      // its share under SlotOrderFair; at least 1
	waiting []waiter // its waiting tasks, in line order
}

// slotPlan is what allot decides.
type slotPlan struct {
	// admit lists the waiting tasks that take the free slots, in the order
	// they take them.
	admit []string
	// used is the slots each namespace with waiting tasks holds once they
	// have.
	used map[string]int
}

// allot decides which waiting tasks take the free slots (free: the
// executor's limit minus the slots in use), one slot at a time: each slot
// goes to the head of a namespace's line, among the namespaces that have
// waiting tasks and are below their own limit. Under SlotOrderFair it is
// the namespace that holds the fewest slots for its weight (used/weight),
// ties to the earliest submitted head, then the namespace's name; under
// SlotOrderFIFO, the namespace whose head comes first (priority, then
// submission time). allot is a pure function of its arguments and does not
// modify them.
func allot(order SlotOrder, free int, spaces map[string]nsSlots) slotPlan {
	plan := slotPlan{used: make(map[string]int, len(spaces))}
	next := make(map[string]int, len(spaces)) // index of each line's head
	for ns, s := range spaces {
		plan.used[ns] = s.used
	}
	for ; free > 0; free-- {
		best := ""
		for ns, s := range spaces {
			if next[ns] >= len(s.waiting) || s.limit > 0 && plan.used[ns] >= s.limit {
				continue
			}
			if best == "" || takesFirst(order, ns, best, spaces, plan.used, next) {
				best = ns
			}
		}
		if best == "" {
			break
		}
		plan.admit = append(plan.admit, spaces[best].waiting[next[best]].id)
		next[best]++
		plan.used[best]++
	}
	return plan
}

// takesFirst reports whether namespace a's head takes a slot before
// namespace b's, under order.
func takesFirst(order SlotOrder, a, b string, spaces map[string]nsSlots, used, next map[string]int) bool {
	ha, hb := spaces[a].waiting[next[a]], spaces[b].waiting[next[b]]
	if order == SlotOrderFair {
		// used[a]/weight[a] < used[b]/weight[b], without division.
		la, lb := used[a]*spaces[b].weight, used[b]*spaces[a].weight
		if la != lb {
			return la < lb
		}
		if !ha.at.Equal(hb.at) {
			return ha.at.Before(hb.at)
		}
		return a < b
	}
	if ha.before(hb) || hb.before(ha) {
		return ha.before(hb)
	}
	return a < b
}

// waitMessage says which limit a task of namespace ns waits for, given the
// slots its namespace holds once the free ones are taken (used), its own
// limit and the executor's: the namespace's limit when it is reached,
// otherwise the executor's. With shards above 1 the limits are a shard's
// part (Config.LimitShards), and the message says so. It names a limit,
// never a count, so that it changes only when another limit holds the task
// (recordSlotWait).
func waitMessage(order SlotOrder, ns string, limit, used, parallelism, shards int) string {
	if limit > 0 && used >= limit {
		if shards > 1 {
			return fmt.Sprintf("namespace %s at its limit of %d in this task's shard (the namespace's limit divided among %d shards)", ns, limit, shards)
		}
		return fmt.Sprintf("namespace %s at its limit of %d", ns, limit)
	}
	slots := fmt.Sprintf("all %d slots in use", parallelism)
	if shards > 1 {
		slots = fmt.Sprintf("all %d slots of this task's shard in use (the parallelism divided among %d shards)", parallelism, shards)
	}
	if order == SlotOrderFIFO {
		return slots + "; tasks start in submission order"
	}
	return slots + "; namespaces with waiting tasks take free slots in turn"
}

// priorityOf reads spec.priority from a stored task document (0 when it
// has none or cannot be read: the sync that decodes the task reports that).
func priorityOf(doc []byte) int32 {
	var t struct {
		Spec struct {
			Priority int32 `json:"priority"`
		} `json:"spec"`
	}
	_ = json.Unmarshal(doc, &t)
	return t.Spec.Priority
}
