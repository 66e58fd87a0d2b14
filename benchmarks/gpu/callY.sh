. "$(dirname "$0")/env.sh"
# After callX on the same machine: the two restarts that keep the compile cache, then the
# loaders. A stamps gate that recorded its stamps reads nothing on a restart, so with the
# page cache dropped the engine loads from the disk (each start ends at "Loading weights took").
L="timeout 110 $G start --gate-mode stamps --stop-after-load"
( $G stop
timeout 150 $G start --restart same-pod --label "same pod: page cache warm, compile cache kept"; pack Y
timeout 150 $G start --restart new-pod --label "new pod, same node: page cache dropped, compile cache kept"; pack Y
$G stop
$L --restart new-pod --label "auto, warm (the stamps gate read the tree first)"; pack Y
$L --restart same-pod --drop-cache --label "auto, cold"; pack Y
$L --restart same-pod --drop-cache --load-format "--load-format fastsafetensors" --label "fastsafetensors, cold"; pack Y
$L --restart same-pod --drop-cache --load-format "--load-format runai_streamer" --label "runai_streamer, cold"; pack Y
$G table > $OUT/tableY.txt 2>&1 ) 2>&1 | tee $OUT/callY.log
pack Y
