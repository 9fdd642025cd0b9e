;; XXH3-64 (xxHash 0.8, with seed) in WebAssembly, and the prompt hashing of hashing.ts over it.
;; Rebuild src/core/xxh3-wasm.ts after editing: npm run build:wasm
;;
;; Why: a prompt's block hashes were one native @node-rs/xxhash call per block, each with a
;; BigInt seed and a BigInt result (~0.32 us of call overhead per block, ~1.4 us per block in all
;; with the chain hash); here one call hashes every block of a prompt and chains the sequence
;; hashes, with no BigInt and no JS between blocks (npm run bench:core).
;;
;; Written from the xxHash specification (doc/xxhash_spec.md) and checked bit for bit against
;; @node-rs/xxhash by test/unit/core/xxh3-wasm.test.ts over every length to 2,100 bytes and
;; random seeds, and by test/unit/core/hashing.test.ts over random prompts.
;;
;; Memory: [0, 192) the default secret; [192, 384) the secret derived from the last long-input
;; seed (its seed in $secretSeed); [384, 448) the 8 accumulators of the long path; the caller's
;; buffers from SCRATCH = 1024 on (inputs and outputs, laid out by the caller).
;; Hashes are written as two little-endian u32, high word first: the HashList layout (hash64.ts).
(module
  (memory (export "memory") 1)
  (data (i32.const 0) "\b8\fe\6c\39\23\a4\4b\be\7c\01\81\2c\f7\21\ad\1c\de\d4\6d\e9\83\90\97\db\72\40\a4\a4\b7\b3\67\1f\cb\79\e6\4e\cc\c0\e5\78\82\5a\d0\7d\cc\ff\72\21\b8\08\46\74\f7\43\24\8e\e0\35\90\e6\81\3a\26\4c\3c\28\52\bb\91\c3\00\cb\88\d0\65\8b\1b\53\2e\a3\71\64\48\97\a2\0d\f9\4e\38\19\ef\46\a9\de\ac\d8\a8\fa\76\3f\e3\9c\34\3f\f9\dc\bb\c7\c7\0b\4f\1d\8a\51\e0\4b\cd\b4\59\31\c8\9f\7e\c9\d9\78\73\64\ea\c5\ac\83\34\d3\eb\c3\c5\81\a0\ff\fa\13\63\eb\17\0d\dd\51\b7\f0\da\49\d3\16\55\26\29\d4\68\9e\2b\16\be\58\7d\47\a1\fc\8f\f8\b8\d1\7a\d0\31\ce\45\cb\3a\8f\95\16\04\28\af\d7\fb\ca\bb\4b\40\7e")
  ;; the seed the derived secret at 192 was made for; $secretReady 0 until the first derivation
  (global $secretSeed (mut i64) (i64.const 0))
  (global $secretReady (mut i32) (i32.const 0))

  ;; low 64 bits xor high 64 bits of the 128-bit product (four 32x32 products)
  (func $mulFold (param $a i64) (param $b i64) (result i64)
    (local $alo i64) (local $ahi i64) (local $blo i64) (local $bhi i64) (local $ll i64) (local $hl i64) (local $cross i64)
    (local.set $alo (i64.and (local.get $a) (i64.const 0xffffffff)))
    (local.set $ahi (i64.shr_u (local.get $a) (i64.const 32)))
    (local.set $blo (i64.and (local.get $b) (i64.const 0xffffffff)))
    (local.set $bhi (i64.shr_u (local.get $b) (i64.const 32)))
    (local.set $ll (i64.mul (local.get $alo) (local.get $blo)))
    (local.set $hl (i64.mul (local.get $ahi) (local.get $blo)))
    (local.set $cross
      (i64.add
        (i64.add (i64.shr_u (local.get $ll) (i64.const 32)) (i64.and (local.get $hl) (i64.const 0xffffffff)))
        (i64.mul (local.get $alo) (local.get $bhi))))
    (i64.xor
      ;; low half
      (i64.or (i64.shl (local.get $cross) (i64.const 32)) (i64.and (local.get $ll) (i64.const 0xffffffff)))
      ;; high half
      (i64.add
        (i64.add (i64.shr_u (local.get $hl) (i64.const 32)) (i64.shr_u (local.get $cross) (i64.const 32)))
        (i64.mul (local.get $ahi) (local.get $bhi)))))

  ;; XXH3_avalanche
  (func $avalanche (param $h i64) (result i64)
    (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 37))))
    (local.set $h (i64.mul (local.get $h) (i64.const 0x165667919E3779F9)))
    (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 32))))

  ;; XXH64_avalanche
  (func $avalanche64 (param $h i64) (result i64)
    (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 33))))
    (local.set $h (i64.mul (local.get $h) (i64.const 0xC2B2AE3D27D4EB4F)))
    (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 29))))
    (local.set $h (i64.mul (local.get $h) (i64.const 0x165667B19E3779F9)))
    (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 32))))

  ;; XXH3_rrmxmx
  (func $rrmxmx (param $h i64) (param $len i64) (result i64)
    (local.set $h (i64.xor (local.get $h) (i64.xor (i64.rotl (local.get $h) (i64.const 49)) (i64.rotl (local.get $h) (i64.const 24)))))
    (local.set $h (i64.mul (local.get $h) (i64.const 0x9FB21C651E98DF25)))
    (local.set $h (i64.xor (local.get $h) (i64.add (i64.shr_u (local.get $h) (i64.const 35)) (local.get $len))))
    (local.set $h (i64.mul (local.get $h) (i64.const 0x9FB21C651E98DF25)))
    (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 28))))

  (func $bswap64 (param $x i64) (result i64)
    (local.set $x (i64.or
      (i64.shl (i64.and (local.get $x) (i64.const 0x00FF00FF00FF00FF)) (i64.const 8))
      (i64.and (i64.shr_u (local.get $x) (i64.const 8)) (i64.const 0x00FF00FF00FF00FF))))
    (local.set $x (i64.or
      (i64.shl (i64.and (local.get $x) (i64.const 0x0000FFFF0000FFFF)) (i64.const 16))
      (i64.and (i64.shr_u (local.get $x) (i64.const 16)) (i64.const 0x0000FFFF0000FFFF))))
    (i64.rotl (local.get $x) (i64.const 32)))

  (func $bswap32 (param $x i32) (result i32)
    (i32.or
      (i32.or (i32.shl (local.get $x) (i32.const 24)) (i32.shl (i32.and (local.get $x) (i32.const 0xff00)) (i32.const 8)))
      (i32.or (i32.and (i32.shr_u (local.get $x) (i32.const 8)) (i32.const 0xff00)) (i32.shr_u (local.get $x) (i32.const 24)))))

  ;; XXH3_mix16B: input at $p, secret at $s
  (func $mix16 (param $p i32) (param $s i32) (param $seed i64) (result i64)
    (call $mulFold
      (i64.xor (i64.load (local.get $p)) (i64.add (i64.load (local.get $s)) (local.get $seed)))
      (i64.xor (i64.load offset=8 (local.get $p)) (i64.sub (i64.load offset=8 (local.get $s)) (local.get $seed)))))

  ;; XXH3_len_9to16 over two u64 words already read (lo: the first 8 bytes, hi: the last 8)
  (func $len9to16 (param $lo i64) (param $hi i64) (param $len i64) (param $seed i64) (result i64)
    (local.set $lo (i64.xor (local.get $lo) (i64.add (i64.xor (i64.load offset=24 (i32.const 0)) (i64.load offset=32 (i32.const 0))) (local.get $seed))))
    (local.set $hi (i64.xor (local.get $hi) (i64.sub (i64.xor (i64.load offset=40 (i32.const 0)) (i64.load offset=48 (i32.const 0))) (local.get $seed))))
    (call $avalanche
      (i64.add
        (i64.add (i64.add (local.get $len) (call $bswap64 (local.get $lo))) (local.get $hi))
        (call $mulFold (local.get $lo) (local.get $hi)))))

  ;; one 64-byte stripe into the accumulators at 384 (XXH3_accumulate_512, two lanes per v128)
  (func $stripe (param $p i32) (param $s i32)
    (local $d v128) (local $dk v128)
    (local.set $d (v128.load offset=0 (local.get $p)))
    (local.set $dk (v128.xor (local.get $d) (v128.load offset=0 (local.get $s))))
    (v128.store offset=384 (i32.const 0) (i64x2.add (i64x2.add (v128.load offset=384 (i32.const 0))
      (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $d) (local.get $d)))
      (i64x2.mul (v128.and (local.get $dk) (v128.const i64x2 0xffffffff 0xffffffff)) (i64x2.shr_u (local.get $dk) (i32.const 32)))))
    (local.set $d (v128.load offset=16 (local.get $p)))
    (local.set $dk (v128.xor (local.get $d) (v128.load offset=16 (local.get $s))))
    (v128.store offset=400 (i32.const 0) (i64x2.add (i64x2.add (v128.load offset=400 (i32.const 0))
      (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $d) (local.get $d)))
      (i64x2.mul (v128.and (local.get $dk) (v128.const i64x2 0xffffffff 0xffffffff)) (i64x2.shr_u (local.get $dk) (i32.const 32)))))
    (local.set $d (v128.load offset=32 (local.get $p)))
    (local.set $dk (v128.xor (local.get $d) (v128.load offset=32 (local.get $s))))
    (v128.store offset=416 (i32.const 0) (i64x2.add (i64x2.add (v128.load offset=416 (i32.const 0))
      (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $d) (local.get $d)))
      (i64x2.mul (v128.and (local.get $dk) (v128.const i64x2 0xffffffff 0xffffffff)) (i64x2.shr_u (local.get $dk) (i32.const 32)))))
    (local.set $d (v128.load offset=48 (local.get $p)))
    (local.set $dk (v128.xor (local.get $d) (v128.load offset=48 (local.get $s))))
    (v128.store offset=432 (i32.const 0) (i64x2.add (i64x2.add (v128.load offset=432 (i32.const 0))
      (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $d) (local.get $d)))
      (i64x2.mul (v128.and (local.get $dk) (v128.const i64x2 0xffffffff 0xffffffff)) (i64x2.shr_u (local.get $dk) (i32.const 32))))))

  ;; XXH3_scrambleAcc with the secret's last 64 bytes at $s
  (func $scramble (param $s i32)
    (local $a v128) (local $i i32)
    (loop $l
      (local.set $a (v128.load offset=384 (local.get $i)))
      (local.set $a (v128.xor (local.get $a) (i64x2.shr_u (local.get $a) (i32.const 47))))
      (local.set $a (v128.xor (local.get $a) (v128.load (i32.add (local.get $s) (local.get $i)))))
      (v128.store offset=384 (local.get $i) (i64x2.mul (local.get $a) (v128.const i64x2 0x9E3779B1 0x9E3779B1)))
      (local.set $i (i32.add (local.get $i) (i32.const 16)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 64)))))

  ;; inputs over 240 bytes (XXH3_hashLong_64b_withSeed): 192-byte secret, 1,024-byte blocks
  (func $long (param $p i32) (param $len i32) (param $seed i64) (result i64)
    (local $sec i32) (local $nb i32) (local $n i32) (local $q i32) (local $k i32) (local $stripes i32) (local $acc i64) (local $i i32)
    (if (i64.ne (local.get $seed) (i64.const 0))
      (then
        (local.set $sec (i32.const 192))
        (if (i32.or (i32.eqz (global.get $secretReady)) (i64.ne (global.get $secretSeed) (local.get $seed)))
          (then
            ;; XXH3_initCustomSecret: even words + seed, odd words - seed
            (loop $d
              (i64.store offset=192 (local.get $i) (i64.add (i64.load (local.get $i)) (local.get $seed)))
              (i64.store offset=200 (local.get $i) (i64.sub (i64.load offset=8 (local.get $i)) (local.get $seed)))
              (local.set $i (i32.add (local.get $i) (i32.const 16)))
              (br_if $d (i32.lt_u (local.get $i) (i32.const 192))))
            (global.set $secretSeed (local.get $seed))
            (global.set $secretReady (i32.const 1))))))
    (i64.store offset=384 (i32.const 0) (i64.const 0xC2B2AE3D))
    (i64.store offset=392 (i32.const 0) (i64.const 0x9E3779B185EBCA87))
    (i64.store offset=400 (i32.const 0) (i64.const 0xC2B2AE3D27D4EB4F))
    (i64.store offset=408 (i32.const 0) (i64.const 0x165667B19E3779F9))
    (i64.store offset=416 (i32.const 0) (i64.const 0x85EBCA77C2B2AE63))
    (i64.store offset=424 (i32.const 0) (i64.const 0x85EBCA77))
    (i64.store offset=432 (i32.const 0) (i64.const 0x27D4EB2F165667C5))
    (i64.store offset=440 (i32.const 0) (i64.const 0x9E3779B1))
    (local.set $nb (i32.shr_u (i32.sub (local.get $len) (i32.const 1)) (i32.const 10)))
    (block $blocksDone (loop $blocks
      (br_if $blocksDone (i32.ge_u (local.get $n) (local.get $nb)))
      (local.set $q (i32.add (local.get $p) (i32.shl (local.get $n) (i32.const 10))))
      (local.set $k (i32.const 0))
      (loop $s16
        (call $stripe (i32.add (local.get $q) (i32.shl (local.get $k) (i32.const 6))) (i32.add (local.get $sec) (i32.shl (local.get $k) (i32.const 3))))
        (local.set $k (i32.add (local.get $k) (i32.const 1)))
        (br_if $s16 (i32.lt_u (local.get $k) (i32.const 16))))
      (call $scramble (i32.add (local.get $sec) (i32.const 128)))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (br $blocks)))
    ;; the last partial block, then the last stripe (ending at the input's end)
    (local.set $q (i32.add (local.get $p) (i32.shl (local.get $nb) (i32.const 10))))
    (local.set $stripes (i32.shr_u (i32.sub (i32.sub (local.get $len) (i32.const 1)) (i32.shl (local.get $nb) (i32.const 10))) (i32.const 6)))
    (local.set $k (i32.const 0))
    (block $partDone (loop $part
      (br_if $partDone (i32.ge_u (local.get $k) (local.get $stripes)))
      (call $stripe (i32.add (local.get $q) (i32.shl (local.get $k) (i32.const 6))) (i32.add (local.get $sec) (i32.shl (local.get $k) (i32.const 3))))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br $part)))
    (call $stripe (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 64)) (i32.add (local.get $sec) (i32.const 121)))
    ;; XXH3_mergeAccs with the secret from byte 11
    (local.set $acc (i64.mul (i64.extend_i32_u (local.get $len)) (i64.const 0x9E3779B185EBCA87)))
    (local.set $i (i32.const 0))
    (loop $m
      (local.set $acc (i64.add (local.get $acc)
        (call $mulFold
          (i64.xor (i64.load offset=384 (local.get $i)) (i64.load offset=11 (i32.add (local.get $sec) (local.get $i))))
          (i64.xor (i64.load offset=392 (local.get $i)) (i64.load offset=19 (i32.add (local.get $sec) (local.get $i)))))))
      (local.set $i (i32.add (local.get $i) (i32.const 16)))
      (br_if $m (i32.lt_u (local.get $i) (i32.const 64))))
    (call $avalanche (local.get $acc)))

  ;; XXH3_64bits_withSeed(memory[p, p + len), seed)
  (func $hash (param $p i32) (param $len i32) (param $seed i64) (result i64)
    (local $acc i64) (local $accEnd i64) (local $i i32) (local $rounds i32) (local $L i64)
    (local.set $L (i64.extend_i32_u (local.get $len)))
    (if (i32.le_u (local.get $len) (i32.const 16))
      (then
        (if (i32.gt_u (local.get $len) (i32.const 8))
          (then (return (call $len9to16 (i64.load (local.get $p)) (i64.load (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 8))) (local.get $L) (local.get $seed)))))
        (if (i32.ge_u (local.get $len) (i32.const 4))
          (then
            (local.set $seed (i64.xor (local.get $seed) (i64.shl (i64.extend_i32_u (call $bswap32 (i32.wrap_i64 (local.get $seed)))) (i64.const 32))))
            (return (call $rrmxmx
              (i64.xor
                (i64.add (i64.load32_u (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 4))) (i64.shl (i64.load32_u (local.get $p)) (i64.const 32)))
                (i64.sub (i64.xor (i64.load offset=8 (i32.const 0)) (i64.load offset=16 (i32.const 0))) (local.get $seed)))
              (local.get $L)))))
        (if (i32.gt_u (local.get $len) (i32.const 0))
          (then
            (return (call $avalanche64
              (i64.xor
                (i64.extend_i32_u
                  (i32.or
                    (i32.or (i32.shl (i32.load8_u (local.get $p)) (i32.const 16)) (i32.shl (i32.load8_u (i32.add (local.get $p) (i32.shr_u (local.get $len) (i32.const 1)))) (i32.const 24)))
                    (i32.or (i32.load8_u (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 1))) (i32.shl (local.get $len) (i32.const 8)))))
                (i64.add (i64.extend_i32_u (i32.xor (i32.load (i32.const 0)) (i32.load offset=4 (i32.const 0)))) (local.get $seed)))))))
        (return (call $avalanche64 (i64.xor (local.get $seed) (i64.xor (i64.load offset=56 (i32.const 0)) (i64.load offset=64 (i32.const 0))))))))
    (local.set $acc (i64.mul (local.get $L) (i64.const 0x9E3779B185EBCA87)))
    (if (i32.le_u (local.get $len) (i32.const 128))
      (then
        (if (i32.gt_u (local.get $len) (i32.const 32))
          (then
            (if (i32.gt_u (local.get $len) (i32.const 64))
              (then
                (if (i32.gt_u (local.get $len) (i32.const 96))
                  (then
                    (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.add (local.get $p) (i32.const 48)) (i32.const 96) (local.get $seed))))
                    (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 64)) (i32.const 112) (local.get $seed))))))
                (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.add (local.get $p) (i32.const 32)) (i32.const 64) (local.get $seed))))
                (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 48)) (i32.const 80) (local.get $seed))))))
            (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.add (local.get $p) (i32.const 16)) (i32.const 32) (local.get $seed))))
            (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 32)) (i32.const 48) (local.get $seed))))))
        (local.set $acc (i64.add (local.get $acc) (call $mix16 (local.get $p) (i32.const 0) (local.get $seed))))
        (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 16)) (i32.const 16) (local.get $seed))))
        (return (call $avalanche (local.get $acc)))))
    (if (i32.le_u (local.get $len) (i32.const 240))
      (then
        (loop $first8
          (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.add (local.get $p) (local.get $i)) (local.get $i) (local.get $seed))))
          (local.set $i (i32.add (local.get $i) (i32.const 16)))
          (br_if $first8 (i32.lt_u (local.get $i) (i32.const 128))))
        ;; the last 16 bytes against secret[119..135) (XXH3_SECRET_SIZE_MIN - XXH3_MIDSIZE_LASTOFFSET)
        (local.set $accEnd (call $mix16 (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 16)) (i32.const 119) (local.get $seed)))
        (local.set $acc (call $avalanche (local.get $acc)))
        (local.set $rounds (i32.shl (i32.shr_u (local.get $len) (i32.const 4)) (i32.const 4)))
        (block $restDone (loop $rest
          (br_if $restDone (i32.ge_u (local.get $i) (local.get $rounds)))
          ;; round i >= 8 against secret[16 (i - 8) + 3)
          (local.set $accEnd (i64.add (local.get $accEnd) (call $mix16 (i32.add (local.get $p) (local.get $i)) (i32.sub (local.get $i) (i32.const 125)) (local.get $seed))))
          (local.set $i (i32.add (local.get $i) (i32.const 16)))
          (br $rest)))
        (return (call $avalanche (i64.add (local.get $acc) (local.get $accEnd))))))
    (call $long (local.get $p) (local.get $len) (local.get $seed)))

  (func $store (param $out i32) (param $h i64)
    (i32.store (local.get $out) (i32.wrap_i64 (i64.shr_u (local.get $h) (i64.const 32))))
    (i32.store offset=4 (local.get $out) (i32.wrap_i64 (local.get $h))))

  (func $load (param $in i32) (result i64)
    (i64.or (i64.shl (i64.load32_u (local.get $in)) (i64.const 32)) (i64.load32_u offset=4 (local.get $in))))

  ;; one hash of memory[p, p + len) with the seed (seedHi << 32 | seedLo), written at out
  (func (export "hash") (param $p i32) (param $len i32) (param $seedHi i32) (param $seedLo i32) (param $out i32)
    (call $store (local.get $out)
      (call $hash (local.get $p) (local.get $len)
        (i64.or (i64.shl (i64.extend_i32_u (local.get $seedHi)) (i64.const 32)) (i64.extend_i32_u (local.get $seedLo))))))

  ;; Block i's hash: the `window` bytes at tok + i * stride, with the seed, written at out + 8i.
  ;; With seqOut != 0 (0 is the secret, never an output), also its sequence hash at seqOut + 8i:
  ;; seq[0] = block[0], seq[i] = XXH3(le_u64(seq[i-1]) ‖ le_u64(block[i]), seed 1337).
  (func (export "blocks") (param $tok i32) (param $count i32) (param $stride i32) (param $window i32) (param $seedHi i32) (param $seedLo i32) (param $out i32) (param $seqOut i32)
    (local $seed i64) (local $i i32) (local $h i64) (local $prev i64) (local $o i32)
    (local.set $seed (i64.or (i64.shl (i64.extend_i32_u (local.get $seedHi)) (i64.const 32)) (i64.extend_i32_u (local.get $seedLo))))
    (block $done (loop $each
      (br_if $done (i32.ge_u (local.get $i) (local.get $count)))
      (local.set $h (call $hash (i32.add (local.get $tok) (i32.mul (local.get $i) (local.get $stride))) (local.get $window) (local.get $seed)))
      (local.set $o (i32.shl (local.get $i) (i32.const 3)))
      (call $store (i32.add (local.get $out) (local.get $o)) (local.get $h))
      (if (local.get $seqOut)
        (then
          (local.set $prev
            (if (result i64) (local.get $i)
              (then (call $len9to16 (local.get $prev) (local.get $h) (i64.const 16) (i64.const 1337)))
              (else (local.get $h))))
          (call $store (i32.add (local.get $seqOut) (local.get $o)) (local.get $prev))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $each))))

  ;; the sequence hashes (as in blocks) of `count` block hashes at in, written at out
  (func (export "chain") (param $in i32) (param $count i32) (param $out i32)
    (local $i i32) (local $prev i64) (local $o i32)
    (if (i32.eqz (local.get $count)) (then (return)))
    (local.set $prev (call $load (local.get $in)))
    (call $store (local.get $out) (local.get $prev))
    (local.set $i (i32.const 1))
    (block $done (loop $each
      (br_if $done (i32.ge_u (local.get $i) (local.get $count)))
      (local.set $o (i32.shl (local.get $i) (i32.const 3)))
      (local.set $prev (call $len9to16 (local.get $prev) (call $load (i32.add (local.get $in) (local.get $o))) (i64.const 16) (i64.const 1337)))
      (call $store (i32.add (local.get $out) (local.get $o)) (local.get $prev))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $each)))))
