//go:build amd64 && !purego

#include "textflag.h"

// func prefetchBuckets(p, q *bucket)
TEXT ·prefetchBuckets(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ p+0(FP), AX
	MOVQ q+8(FP), BX
	PREFETCHT0 (AX)
	PREFETCHT0 64(AX)
	PREFETCHT0 (BX)
	PREFETCHT0 64(BX)
	RET
