. "$(dirname "$0")/env.sh"
# Loaders, part 2, on the machine callL.sh left warm (about 400 s): runai_streamer cold and
# warm, the two --safetensors-load-strategy values cold, and auto cold again (its spread).
L="timeout 150 $G start --gate-mode stamps --stop-after-load"
( $L --restart same-pod --drop-cache --load-format "--load-format runai_streamer" --label "runai_streamer, cold"; pack M
$L --restart same-pod --load-format "--load-format runai_streamer" --label "runai_streamer, warm"; pack M
for s in prefetch eager; do
  $L --restart same-pod --drop-cache --load-format "--safetensors-load-strategy $s" --label "auto + strategy $s, cold"; pack M
done
$L --restart same-pod --drop-cache --label "auto, cold (again)"; pack M
$G table > $OUT/tableM.txt 2>&1 ) 2>&1 | tee $OUT/callM.log
pack M
