#!/bin/bash
# Run 43's groups (prepared 2026-12-06, fourth session). From the repository root, carry
# [".whl"]:  bash benchmarks/results/run43/device_run43.sh "live shapes"
#   live    the live 8B server at 1 / 8 / 64 / 256 against the step at the server's 4k
#           context, now with the compile counters: is the 1.5-2 s stall when the 64 level
#           turns to decode a compile (ninfer_step_launch_compiles_total, "compiling N ms")?
#   shapes  prime_probe's runs 1-4 of the mixed (256-token, 256-row) step and its neighbours:
#           is a chunk beside 33-255 rows slow as a shape, or only as admission?
# Groups not defined here fall through to run 41's script (gemma31 moe35prof hybrid27 ...).
# Everything goes to /tmp/o43, tarred into $OUT/run43-<groups>.tgz unless NO_TAR is set.
FINAL=${OUT:-/tmp/out}; export OUT=/tmp/o43; rm -rf "$OUT"; mkdir -p "$OUT"
for g in $1; do
  for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
    kill -9 "$p" 2>/dev/null; done
  case $g in
    live)
      . benchmarks/device_common.sh; stamp live
      timeout 360 python3 benchmarks/gpu_serve_bench.py --presets qwen3-8b --total 350 \
        --stages install,artifact,step,warm,load --out "$OUT/gsb" > "$OUT/gsb.out" 2>&1
      stamp "live rc=$?"; sed -n '/^stage  /,$p' "$OUT/gsb.out" | tee -a "$OUT/stages.log"
      grep -h "slow step submit\|copy shapes compiled" "$OUT"/gsb/server-*.log | head -20 \
        | tee -a "$OUT/stages.log";;
    shapes)
      . benchmarks/device_common.sh; ART=/tmp/gsb/qwen3-8b.ninfer; stamp shapes
      [ -f "$ART/metadata.json" ] || timeout 75 python3 -m ninfer_jax.cli.main init-random \
        --preset qwen3-8b --quiet --force "$ART" > "$OUT/artifact.log" 2>&1
      timeout 200 python3 benchmarks/prime_probe.py "$ART" --shapes 256x256,256x32,0x64,0x256 \
        --runs 4 --json > "$OUT/shapes.jsonl" 2> "$OUT/shapes.log"
      stamp "shapes rc=$?"; cat "$OUT/shapes.jsonl" | tee -a "$OUT/stages.log";;
    *) NO_TAR=1 bash benchmarks/results/run41/device_run41.sh "$g"; mkdir -p "$OUT/$g"
       cp -r /tmp/o41/. "$OUT/$g"/ 2>/dev/null; cp -r /tmp/o/. "$OUT/$g"/ 2>/dev/null;;
  esac
done
[ -n "$NO_TAR" ] || { tar czf "$FINAL/run43-${1// /-}.tgz" -C "$OUT" . && ls -la "$OUT"; }
