// pause is the first process of every pod sandbox on the local cluster's nodes: it
// holds the pod's namespaces open for as long as the pod lives, and does nothing else.
// It is the project's own because no registry is reached here, so the upstream pause
// image cannot be pulled; containerd's CRI names it as its sandbox_image.
//
// As PID 1 of a pod that shares its process namespace it reaps the orphans the other
// containers leave (the kernel hands them to it), and it exits at once on SIGINT or
// SIGTERM, as the kubelet expects when it stops the sandbox.
//
// Built static (CGO_ENABLED=0) so the image needs no libc: one file, from scratch.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is the image's tag (operator/cellplane_operator/localplane/images.py sets it
// with -ldflags -X); `pause -v` prints it.
var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Printf("pause (cellplane) %s\n", version)
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not PID 1, orphans will not be reaped")
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for received := range signals {
		if received == syscall.SIGCHLD {
			reapChildren()
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: shutting down, got signal %v\n", received)
		os.Exit(0)
	}
}

// reapChildren collects every exited child at once: one SIGCHLD may stand for several.
func reapChildren() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
