;; The token_ids byte loop of src/http/token-ids.ts (parseU32Array), in WebAssembly.
;; Rebuild src/http/u32-array-wasm.ts after editing: npm run build:wasm
;;
;; parse(p, out): memory[p...] holds an array's bytes just after its `[`, up to and including the
;; first `]`. Writes each element as a u32 (little-endian) at out, out + 4, ... and returns how
;; many, or -1 when the array is not all canonical integer literals in [0, 2^32) separated by
;; commas with optional JSON whitespace (the caller then falls back to the generic parser).
;; Every scan stops at the `]` (not a digit, whitespace or comma), so nothing past it is read.
(module
  (memory (export "memory") 1)
  (func $ws (param $c i32) (result i32)
    (i32.or
      (i32.or (i32.eq (local.get $c) (i32.const 32)) (i32.eq (local.get $c) (i32.const 10)))
      (i32.or (i32.eq (local.get $c) (i32.const 13)) (i32.eq (local.get $c) (i32.const 9)))))
  (func (export "parse") (param $p i32) (param $out i32) (result i32)
    (local $c i32) (local $d i32) (local $v i64) (local $ds i32) (local $n i32)
    (local.set $c (i32.load8_u (local.get $p)))
    ;; leading whitespace; `]` first: the empty array
    (block $a (loop $b
      (br_if $a (i32.eqz (call $ws (local.get $c))))
      (local.set $p (i32.add (local.get $p) (i32.const 1)))
      (local.set $c (i32.load8_u (local.get $p)))
      (br $b)))
    (if (i32.eq (local.get $c) (i32.const 93)) (then (return (i32.const 0))))
    (loop $elem
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
