// CoreDNS with only the plugins the e2e node's cluster DNS needs (the way CoreDNS documents
// building it as a library: set dnsserver.Directives, import the plugins, run coremain).
// All of CoreDNS's ~50 plugins would add cloud SDKs and minutes of build for nothing.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// In the order CoreDNS's own plugin.cfg runs them.
var directives = []string{"errors", "log", "ready", "kubernetes"}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
