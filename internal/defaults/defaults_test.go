package defaults

import (
	"testing"
	"time"
)

func TestPositive(t *testing.T) {
	for _, c := range []struct{ in, want int }{{0, 7}, {-3, 7}, {5, 5}} {
		v := c.in
		Positive(&v, 7)
		if v != c.want {
			t.Errorf("Positive(%d, 7) = %d, want %d", c.in, v, c.want)
		}
	}
	d := time.Duration(0)
	Positive(&d, time.Second)
	if d != time.Second {
		t.Errorf("Positive(0s, 1s) = %v", d)
	}
}

func TestZero(t *testing.T) {
	for _, c := range []struct{ in, want time.Duration }{{0, time.Second}, {-1, -1}, {5, 5}} {
		v := c.in
		Zero(&v, time.Second)
		if v != c.want {
			t.Errorf("Zero(%v, 1s) = %v, want %v", c.in, v, c.want)
		}
	}
}
