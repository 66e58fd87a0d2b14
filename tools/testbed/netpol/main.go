// kube-router's NetworkPolicy controller alone, for the e2e node tier (tests/e2e/node.py):
// it watches Pods, Namespaces and NetworkPolicies and enforces them with iptables and
// ipset on the node, bridged pod-to-pod traffic included (physdev), which the bridge CNI
// does not. The same controller k3s embeds (pkg/agent/netpol there); kube-router's own
// binary would also link its BGP router and IPVS proxy, which the node does not run.
//
// Why not sigs.k8s.io/kube-network-policies: it sends each new connection's first packet
// to user space with the nftables `queue` statement, and this machine's kernel is built
// without CONFIG_NFT_QUEUE (`nft add rule ... queue num 100` fails: "No such file or
// directory"); kube-router needs only iptables' set, physdev and comment matches.
//
//	kube-router-netpol --kubeconfig FILE --hostname-override NODE \
//	    --service-cluster-ip-range CIDR [--iptables-sync-period 5m] [-v 2]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cloudnativelabs/kube-router/v2/pkg/controllers/netpol"
	"github.com/cloudnativelabs/kube-router/v2/pkg/healthcheck"
	"github.com/cloudnativelabs/kube-router/v2/pkg/options"
	"github.com/cloudnativelabs/kube-router/v2/pkg/utils"
	"github.com/coreos/go-iptables/iptables"
	v1core "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kube-router-netpol:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := options.NewKubeRouterConfig()
	klog.InitFlags(nil)
	flag.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server (required)")
	flag.StringVar(&cfg.HostnameOverride, "hostname-override", "", "the node's name (required)")
	cidrs := flag.String("service-cluster-ip-range", strings.Join(cfg.ClusterIPCIDRs, ","),
		"the cluster's Service CIDR (kube-router lets traffic to it pass to kube-proxy's DNAT)")
	flag.DurationVar(&cfg.IPTablesSyncPeriod, "iptables-sync-period", cfg.IPTablesSyncPeriod,
		"full resync period (events resync at once)")
	flag.Parse()
	if cfg.Kubeconfig == "" || cfg.HostnameOverride == "" {
		return fmt.Errorf("--kubeconfig and --hostname-override are required")
	}
	cfg.ClusterIPCIDRs = strings.Split(*cidrs, ",")
	cfg.EnableIPv4, cfg.EnableIPv6 = true, false
	cfg.RunFirewall, cfg.RunRouter, cfg.RunServiceProxy = true, false, false

	rest, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return err
	}
	ipt, err := iptables.NewWithProtocol(iptables.ProtocolIPv4)
	if err != nil {
		return fmt.Errorf("iptables: %w", err)
	}
	ipset, err := utils.NewIPSet(false)
	if err != nil {
		return fmt.Errorf("ipset: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	factory := informers.NewSharedInformerFactory(client, 0)
	pods := factory.Core().V1().Pods().Informer()
	namespaces := factory.Core().V1().Namespaces().Informer()
	policies := factory.Networking().V1().NetworkPolicies().Informer()
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())

	npc, err := netpol.NewNetworkPolicyController(client, cfg, pods, policies, namespaces, &sync.Mutex{},
		map[v1core.IPFamily]utils.IPTablesHandler{v1core.IPv4Protocol: ipt},
		map[v1core.IPFamily]utils.IPSetHandler{v1core.IPv4Protocol: ipset})
	if err != nil {
		return err
	}
	if _, err := pods.AddEventHandler(npc.PodEventHandler); err != nil {
		return err
	}
	if _, err := namespaces.AddEventHandler(npc.NamespaceEventHandler); err != nil {
		return err
	}
	if _, err := policies.AddEventHandler(npc.NetworkPolicyEventHandler); err != nil {
		return err
	}

	// The controller reports a heartbeat after every sync on this channel and blocks until
	// someone reads it; kube-router's health server would. Nothing here serves health.
	heartbeats := make(chan *healthcheck.ControllerHeartbeat, 1)
	go func() {
		for range heartbeats {
		}
	}()
	var wg sync.WaitGroup
	wg.Add(1)
	klog.Infof("kube-router network policy controller on node %s, sync every %s",
		cfg.HostnameOverride, cfg.IPTablesSyncPeriod)
	go npc.Run(heartbeats, ctx.Done(), &wg)
	<-ctx.Done()
	// Run returns once its sync loop sees the stop; the rules stay (they go with the
	// network namespace), as kube-router's own binary leaves them on exit.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	return nil
}
