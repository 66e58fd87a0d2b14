. "$(dirname "$0")/env.sh"
( $G stop
timeout 200 $G start --restart same-pod --label "same pod: page cache warm, compile cache kept"; pack B
timeout 200 $G start --restart new-pod --label "new pod, same node: page cache dropped, compile cache kept"; pack B
timeout 240 $G start --restart new-node --label "new node: page cache and compile cache cold"; pack B
$G stop; $G table > $OUT/tableB.txt 2>&1 ) 2>&1 | tee $OUT/callB.log
pack B
