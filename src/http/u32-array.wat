;; The token_ids byte loop of src/http/token-ids.ts (parseU32Array), in WebAssembly.
;; Rebuild src/http/u32-array-wasm.ts after editing: npm run build:wasm
;;
;; parse(p, out): memory[p...] holds an array's bytes just after its `[`, up to and including the
;; first `]`. Writes each element as a u32 (little-endian) at out, out + 4, ... and returns how
;; many, or -1 when the array is not all canonical integer literals in [0, 2^32) separated by
;; commas with optional JSON whitespace (the caller then falls back to the generic parser).
;; Every scan stops at the `]` (not a digit, whitespace or comma), so nothing past it is used.
;;
;; The common case, digits and commas only (what JSON.stringify writes), runs 16 bytes at a time:
;; a v128 compare classifies the 16 bytes at p; when all are digits or commas, every element that
;; ends at a comma inside them is converted without a per-byte loop (up to 8 digits: an 8-byte
;; SWAR multiply-add, the first digit in the lowest byte). Anything else (whitespace, the `]`, an
;; element of 9 or 10 digits, no comma in the 16 bytes) takes the byte loop for one element, which
;; decides every error exactly as before. The 16-byte loads may read up to 15 bytes past the `]`:
;; the caller's memory always extends that far (the output area follows the input), and those
;; bytes never decide anything since the `]` already fails the classification.
(module
  (memory (export "memory") 1)
  (func $ws (param $c i32) (result i32)
    (i32.or
      (i32.or (i32.eq (local.get $c) (i32.const 32)) (i32.eq (local.get $c) (i32.const 10)))
      (i32.or (i32.eq (local.get $c) (i32.const 13)) (i32.eq (local.get $c) (i32.const 9)))))
  (func (export "parse") (param $p i32) (param $out i32) (result i32)
    (local $c i32) (local $d i32) (local $v i64) (local $ds i32) (local $n i32)
    (local $vv v128) (local $cm i32) (local $base i32) (local $q i32) (local $len i32) (local $w i64)
    (local.set $c (i32.load8_u (local.get $p)))
    ;; leading whitespace; `]` first: the empty array
    (block $a (loop $b
      (br_if $a (i32.eqz (call $ws (local.get $c))))
      (local.set $p (i32.add (local.get $p) (i32.const 1)))
      (local.set $c (i32.load8_u (local.get $p)))
      (br $b)))
    (if (i32.eq (local.get $c) (i32.const 93)) (then (return (i32.const 0))))
    (loop $elem
      ;; p is at an element's start (possibly after whitespace following a comma)
      (block $scalar
        (loop $chunk
          (local.set $vv (v128.load (local.get $p)))
          (br_if $scalar (i32.ne
            (i8x16.bitmask (v128.or
              (i8x16.lt_u (i8x16.sub (local.get $vv) (v128.const i8x16 48 48 48 48 48 48 48 48 48 48 48 48 48 48 48 48)) (v128.const i8x16 10 10 10 10 10 10 10 10 10 10 10 10 10 10 10 10))
              (i8x16.eq (local.get $vv) (v128.const i8x16 44 44 44 44 44 44 44 44 44 44 44 44 44 44 44 44))))
            (i32.const 0xffff)))
          (local.set $cm (i8x16.bitmask (i8x16.eq (local.get $vv) (v128.const i8x16 44 44 44 44 44 44 44 44 44 44 44 44 44 44 44 44))))
          (br_if $scalar (i32.eqz (local.get $cm)))
          (local.set $base (local.get $p))
          (loop $commas
            ;; the element [p, q) ends at the comma at q
            (local.set $q (i32.add (local.get $base) (i32.ctz (local.get $cm))))
            (local.set $len (i32.sub (local.get $q) (local.get $p)))
            (if (i32.eqz (local.get $len)) (then (return (i32.const -1))))
            (br_if $scalar (i32.gt_u (local.get $len) (i32.const 8)))
            ;; a leading zero may not be followed by a digit
            (if (i32.and (i32.gt_u (local.get $len) (i32.const 1)) (i32.eq (i32.load8_u (local.get $p)) (i32.const 48)))
              (then (return (i32.const -1))))
            ;; SWAR: digits to values (xor '0'), right-aligned (the shifted-in low bytes act as
            ;; leading zeros), then pairs, quads, the eight
            (local.set $w (i64.shl
              (i64.xor (i64.load (local.get $p)) (i64.const 0x3030303030303030))
              (i64.extend_i32_u (i32.shl (i32.sub (i32.const 8) (local.get $len)) (i32.const 3)))))
            (local.set $w (i64.shr_u (i64.mul (i64.and (local.get $w) (i64.const 0x0F0F0F0F0F0F0F0F)) (i64.const 2561)) (i64.const 8)))
            (local.set $w (i64.shr_u (i64.mul (i64.and (local.get $w) (i64.const 0x00FF00FF00FF00FF)) (i64.const 6553601)) (i64.const 16)))
            (local.set $w (i64.shr_u (i64.mul (i64.and (local.get $w) (i64.const 0x0000FFFF0000FFFF)) (i64.const 42949672960001)) (i64.const 32)))
            (i32.store (i32.add (local.get $out) (i32.shl (local.get $n) (i32.const 2))) (i32.wrap_i64 (local.get $w)))
            (local.set $n (i32.add (local.get $n) (i32.const 1)))
            (local.set $p (i32.add (local.get $q) (i32.const 1)))
            (local.set $cm (i32.and (local.get $cm) (i32.sub (local.get $cm) (i32.const 1))))
            (br_if $commas (local.get $cm)))
          (br $chunk)))
      ;; the byte loop, for one element: whitespace, then the element
      (local.set $c (i32.load8_u (local.get $p)))
      (block $a0 (loop $b0
        (br_if $a0 (i32.eqz (call $ws (local.get $c))))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (local.set $c (i32.load8_u (local.get $p)))
        (br $b0)))
      ;; a digit must start the element (c - '0' as unsigned: bytes below '0' wrap high)
      (local.set $d (i32.sub (local.get $c) (i32.const 48)))
      (if (i32.gt_u (local.get $d) (i32.const 9)) (then (return (i32.const -1))))
      (local.set $ds (local.get $p))
      (local.set $v (i64.extend_i32_u (local.get $d)))
      (local.set $p (i32.add (local.get $p) (i32.const 1)))
      (local.set $c (i32.load8_u (local.get $p)))
      (local.set $d (i32.sub (local.get $c) (i32.const 48)))
      (if (i64.eqz (local.get $v))
        ;; a leading zero may not be followed by a digit
        (then (if (i32.le_u (local.get $d) (i32.const 9)) (then (return (i32.const -1)))))
        (else
          (block $dd (loop $dl
            (br_if $dd (i32.gt_u (local.get $d) (i32.const 9)))
            (local.set $v (i64.add (i64.mul (local.get $v) (i64.const 10)) (i64.extend_i32_u (local.get $d))))
            (local.set $p (i32.add (local.get $p) (i32.const 1)))
            (local.set $c (i32.load8_u (local.get $p)))
            (local.set $d (i32.sub (local.get $c) (i32.const 48)))
            (br $dl)))
          ;; more than 10 digits is out of range (and may have wrapped $v): refuse first
          (if (i32.gt_u (i32.sub (local.get $p) (local.get $ds)) (i32.const 10)) (then (return (i32.const -1))))
          (if (i64.gt_u (local.get $v) (i64.const 4294967295)) (then (return (i32.const -1))))))
      (i32.store (i32.add (local.get $out) (i32.shl (local.get $n) (i32.const 2))) (i32.wrap_i64 (local.get $v)))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      ;; separator: `,` right after the digits, else whitespace then `]` (done) or `,`
      (if (i32.ne (local.get $c) (i32.const 44))
        (then
          (block $a2 (loop $b2
            (br_if $a2 (i32.eqz (call $ws (local.get $c))))
            (local.set $p (i32.add (local.get $p) (i32.const 1)))
            (local.set $c (i32.load8_u (local.get $p)))
            (br $b2)))
          (if (i32.eq (local.get $c) (i32.const 93)) (then (return (local.get $n))))
          (if (i32.ne (local.get $c) (i32.const 44)) (then (return (i32.const -1))))))
      ;; past the comma: whitespace, then the next element
      (local.set $p (i32.add (local.get $p) (i32.const 1)))
      (local.set $c (i32.load8_u (local.get $p)))
      (block $a3 (loop $b3
        (br_if $a3 (i32.eqz (call $ws (local.get $c))))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (local.set $c (i32.load8_u (local.get $p)))
        (br $b3)))
      (br $elem))
    (i32.const -1)))
