package cluster

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// childProc is a server process started by the benchmark (an etcd member
// or a shale-server node): it records the exit and where the output went.
type childProc struct {
	name    string // for messages, e.g. "etcd member etcd0", "shale-server node 1"
	cmd     *exec.Cmd
	out     *os.File // the process's stdout and stderr
	logNote string   // added to tail's text: where a further log is (may be empty)
	done    chan struct{}
	waitErr error // set before done is closed
}

// stopGrace is how long a stopped process has after SIGTERM before SIGKILL.
const stopGrace = 20 * time.Second

// startChild starts cmd (in its own process group, see memberSysProcAttr)
// with stdout and stderr in a new file at outPath.
func startChild(name string, cmd *exec.Cmd, outPath, logNote string) (*childProc, error) {
	out, err := os.Create(outPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = memberSysProcAttr()
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &childProc{name: name, cmd: cmd, out: out, logNote: logNote, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *childProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail is the end of the process's output, for error messages.
func (p *childProc) tail() string {
	name := p.out.Name()
	b, _ := os.ReadFile(name)
	b = bytes.TrimSpace(b)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	s := fmt.Sprintf("output %s ends: %s", name, b)
	if len(b) == 0 {
		s = fmt.Sprintf("no output in %s", name)
	}
	if p.logNote != "" {
		s += "; " + p.logNote
	}
	return s
}

// stopChildren sends SIGTERM to every process still running, waits for each
// (SIGKILL after stopGrace) and closes its output. It returns the errors: a
// process that had to be killed or exited with an error.
func stopChildren(procs []*childProc) []error {
	for _, p := range procs {
		if !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	var errs []error
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(stopGrace):
			_ = p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("%s did not exit within %s of SIGTERM; killed", p.name, stopGrace))
		}
		if p.waitErr != nil {
			errs = append(errs, fmt.Errorf("%s: %v; %s", p.name, p.waitErr, p.tail()))
		}
		p.out.Close()
	}
	return errs
}
