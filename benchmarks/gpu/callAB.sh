. "$(dirname "$0")/env.sh"
# After a call A whose start ran: a new-node start, the proxy and Workload A, then the
# same-pod and new-pod restarts (call B without its second new-node start).
( $G stop
timeout 240 $G start --restart new-node --label "new node: page cache and compile cache cold"; pack AB
$G proxy
timeout 260 $G bench --concurrencies 8; pack AB
$G stop
timeout 150 $G start --restart same-pod --label "same pod: page cache warm, compile cache kept"; pack AB
timeout 150 $G start --restart new-pod --label "new pod, same node: page cache dropped, compile cache kept"; pack AB
$G stop; $G table > $OUT/tableAB.txt 2>&1 ) 2>&1 | tee $OUT/callAB.log
pack AB
