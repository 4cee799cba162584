package executor

import "testing"

func TestFIFOLetsGoOfItsArrayOnceEmpty(t *testing.T) {
	var q fifo[string]
	for i := range 3000 {
		q.Push(string(rune('a' + i%26)))
	}
	for i := range 2999 {
		if got, want := q.Pop(), string(rune('a'+i%26)); got != want {
			t.Fatalf("pop %d: %q, want %q (first in, first out)", i, got, want)
		}
	}
	if q.Len() != 1 {
		t.Fatalf("after 2,999 pops: %d left, want 1", q.Len())
	}
	q.Pop()
	if q.Len() != 0 || q.items != nil {
		t.Fatalf("emptied queue keeps an array of %d items (DefaultQueue's would: the burst's room for good)", cap(q.items))
	}
	q.Push("x")
	if q.Len() != 1 || q.Pop() != "x" {
		t.Fatal("the emptied queue does not take items again")
	}
}

func TestEmptied(t *testing.T) {
	m := map[string]int{}
	for i := range 1000 {
		m[string(rune(i))] = i
	}
	if got := emptied(m); len(got) != 1000 {
		t.Fatalf("emptied dropped a map with %d entries", len(m))
	}
	for k := range m {
		delete(m, k)
	}
	got := emptied(m)
	got["new"] = 1
	if len(m) != 0 {
		t.Fatal("emptied returned the burst's map itself, with its room, rather than a new one")
	}
}
