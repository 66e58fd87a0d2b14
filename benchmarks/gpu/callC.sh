. "$(dirname "$0")/env.sh"
# Loaders: a stamps gate that recorded its stamps reads nothing on a restart, so with the
# page cache dropped the engine loads from the disk; without, from memory.
L="timeout 150 $G start --gate-mode stamps --stop-after-load"
( $G stop
$L --restart new-pod --label "auto, warm (the first stamps gate read it)"; pack C
$L --restart same-pod --drop-cache --label "auto, cold"; pack C
for f in fastsafetensors runai_streamer; do
  $L --restart same-pod --drop-cache --load-format "--load-format $f" --label "$f, cold"; pack C
  $L --restart same-pod --load-format "--load-format $f" --label "$f, warm"; pack C
done
for s in prefetch eager; do
  $L --restart same-pod --drop-cache --load-format "--safetensors-load-strategy $s" --label "auto + strategy $s, cold"; pack C
done
$G table > $OUT/tableC.txt 2>&1 ) 2>&1 | tee $OUT/callC.log
pack C
