package events

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// FuzzDecode checks that Decode never panics, that every error wraps
// ErrMalformed, that the hand-written Decoder and the library-based oracle
// refDecode accept exactly the same payloads and decode them to the same
// Batch, and that whatever decodes survives re-encoding: in the map era and
// in the array era, Decode(AppendPayload(b)) equals b.
func FuzzDecode(f *testing.F) {
	for _, name := range slices.Concat(payloadFixtureFiles, sglangCaptureFiles, vllmModelFiles) {
		raw, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		var fx payloadFixture
		if err := json.Unmarshal(raw, &fx); err != nil {
			f.Fatal(err)
		}
		for _, m := range fx.Messages {
			p, err := hex.DecodeString(m.PayloadHex)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(p)
		}
	}
	for _, v := range specVectors {
		f.Add(hx(v.hex))
	}
	f.Add(hx(sglangPayloadHex))
	for _, v := range unknownEventVectors {
		f.Add(hx(v.hex))
	}
	for _, m := range malformedVectors {
		f.Add(hx(m.hex))
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, opt := range allOptions() {
		p, err := AppendPayload(nil, genBatch(r, opt), opt)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	p, err := AppendPayload(nil, benchBatch(), EncodeOptions{Encoding: EncodingMap})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(p)

	d := NewDecoder()
	var b, again Batch
	f.Fuzz(func(t *testing.T, payload []byte) {
		err := d.Decode(payload, &b)
		ref, refErr := refDecode(payload)
		switch {
		case errors.Is(refErr, errRefTooDeep):
		case err != nil && refErr == nil:
			t.Fatalf("Decoder rejects what the reference decoder accepts: %v\n%x", err, payload)
		case err == nil && refErr != nil:
			t.Fatalf("Decoder accepts what the reference decoder rejects: %v\n%x", refErr, payload)
		case err == nil:
			if diff := diffBatch(&b, ref); diff != "" {
				t.Fatalf("Decoder and reference decoder differ: %s\n%x", diff, payload)
			}
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		want, err := Decode(payload)
		if err != nil {
			t.Fatalf("Decode: %v, but Decoder.Decode into a reused Batch succeeded", err)
		}
		if diff := diffBatch(&b, want); diff != "" {
			t.Fatalf("reused Batch differs from a fresh one: %s", diff)
		}
		for _, opt := range []EncodeOptions{{Encoding: EncodingMap}, {Encoding: EncodingArray}} {
			enc, err := AppendPayload(nil, want, opt)
			if err != nil {
				t.Fatalf("%v: re-encoding a decoded batch: %v", opt.Encoding, err)
			}
			if err := d.Decode(enc, &again); err != nil {
				t.Fatalf("%v: decoding the re-encoded batch: %v\n%x", opt.Encoding, err, enc)
			}
			again.UnknownEvents, again.UnknownTag = want.UnknownEvents, want.UnknownTag // not re-encoded
			if opt.Encoding == EncodingArray && len(again.Events) == len(want.Events) {
				for i := range again.Events { // the array era has no cache_salt or locality slot
					again.Events[i].CacheSalt = want.Events[i].CacheSalt
					if want.Events[i].Locality == LocalityRemote {
						again.Events[i].Locality, again.Events[i].Medium = LocalityRemote, MediumExternal
					}
				}
			}
			if diff := diffBatch(&again, want); diff != "" {
				t.Fatalf("%v: round trip: %s\n%x", opt.Encoding, diff, enc)
			}
		}
	})
}

// unknownEventVectors seed FuzzDecode with batches holding an event of an
// unknown type between a store and a removal, in both eras.
var unknownEventVectors = []struct{ hex string }{
	{"93cb400400000000000093" + "8aa474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573910ab1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647392" +
		"0102aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c0a86c6f63616c697479a652454d4f5445" +
		"84a474797065ab4675747572654576656e74ac626c6f636b5f6861736865739201" + "02a66e657374656481a161920181a162c0a178c4026869" +
		"83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391" + "0aa66d656469756da3435055c0"},
	{"93cb400400000000000093" + "9cab426c6f636b53746f72656491" + "0ac0920102" + "02c0a3435055c0c0c0c0c0" +
		"94ab4675747572654576656e7492010281a16b92c3cb3ff8000000000000c0" +
		"94ac426c6f636b52656d6f76656491" + "0aa3435055c0c0c0"},
}
