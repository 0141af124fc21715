package events_test

import (
	"encoding/hex"
	"fmt"

	"github.com/kvindex/kvindex/events"
)

func ExampleDecode() {
	// The payload frame of a vLLM message: two BlockRemoved events in the
	// map era (vLLM main).
	payload, _ := hex.DecodeString("93cb41da4aa6e04000009284a474797065ac426c6f636b52656d6f766564" +
		"ac626c6f636b5f68617368657391cfca93c351dcf8d32ea66d656469756da3475055a967726f75705f69647801" +
		"83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cfa49d1a371975611d" +
		"a66d656469756da343505500")
	b, err := events.Decode(payload)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("ts=%.2f dp_rank=%d\n", b.Timestamp, b.DPRank)
	for _, e := range b.Events {
		fmt.Println(e.Kind, e.BlockHashes, e.Medium)
	}

	// Errors say what was wrong and where.
	_, err = events.Decode(payload[:20])
	fmt.Println(err)
	// Output:
	// ts=1764400001.00 dp_rank=0
	// BlockRemoved [14597225573604971310] GPU
	// BlockRemoved [11861665817516400925] CPU
	// events: malformed payload: event 0 field type: str of 12 bytes overruns the payload (2 bytes left) at offset 17: ... 00 92 84 a4 74 79 70 65 [ac] 42 6c
}

func ExampleDecoder_Decode() {
	// One Decoder and one Batch per subscriber goroutine: after the first
	// payloads, decoding allocates nothing.
	d := events.NewDecoder()
	var b events.Batch
	for _, h := range []string{
		"93cb41da4aa6e05000009181a474797065b0416c6c426c6f636b73436c656172656400",
		"93cb41da4aa6e05000009191b0416c6c426c6f636b73436c656172656400",
	} {
		payload, _ := hex.DecodeString(h)
		if err := d.Decode(payload, &b); err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(len(b.Events), b.Events[0].Kind)
	}
	// Output:
	// 1 AllBlocksCleared
	// 1 AllBlocksCleared
}
